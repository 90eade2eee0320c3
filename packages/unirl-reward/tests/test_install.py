"""Fresh venv with only unirl-types + unirl-reward (no torch): serve via the console script, score text."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
UV = ROOT / ".venv" / "bin" / "uv"

CLIENT = """
import sys
from unirl.reward.client import RewardClient
from unirl.reward.protocol import ScoreItem
try:
    import torch  # noqa: F401
    sys.exit("torch must not be installed by unirl-reward")
except ImportError:
    pass
with RewardClient(sys.argv[1]) as c:
    r = c.score([ScoreItem(response="so #### 12", reference="12"), ScoreItem(response="#### 13", reference="12")])
    print([x.total for x in r])
"""


@pytest.mark.slow
def test_fresh_venv_without_torch_scores_text(tmp_path):
    if not UV.exists():
        pytest.skip(f"uv not found at {UV}")
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    subprocess.run(
        [str(UV), "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=120, env=env
    )
    subprocess.run(
        [
            str(UV),
            "pip",
            "install",
            "-q",
            "--python",
            str(venv / "bin" / "python"),
            str(ROOT / "packages" / "unirl-types"),
            str(ROOT / "packages" / "unirl-reward"),
        ],
        check=True,
        timeout=300,
        env=env,
    )
    cfg = tmp_path / "scorers.yaml"
    cfg.write_text("scorers:\n  - {name: answer, scorer: {kind: exact_match, extractor: gsm8k}}\n")
    port_file = tmp_path / "port"
    server = subprocess.Popen(
        [
            str(venv / "bin" / "unirl-reward"),
            "serve",
            "--config",
            str(cfg),
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ],
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():  # bounded poll on the file the server writes once listening
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"server did not start (exit code {server.poll()})")
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text()}"
        out = subprocess.run(
            [str(venv / "bin" / "python"), "-c", CLIENT, url],
            check=True,
            timeout=60,
            capture_output=True,
            text=True,
            env=env,
        )
        assert out.stdout.strip() == "[1.0, 0.0]"
    finally:
        server.terminate()
        server.wait(timeout=20)
