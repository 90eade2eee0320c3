"""`pip install ./packages/unirl-types` into a fresh venv without torch: import works, a Sample round-trips."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]

SCRIPT = """
import importlib.util, numpy as np
assert importlib.util.find_spec("torch") is None, "torch must not be installed"
import unirl.types as t
s = t.Sample(id="a", group_id="g", inputs=[t.TextPrimitive(text="two red circles")],
    parts=[t.Part(name="diffusion", segment=t.LatentTrajectory(latents=np.ones((2, 3), np.float32),
    positions=[0, 1], sigmas=[1.0, 0.0], sde_indices=[0], log_probs=np.zeros(1, np.float32)))])
b = t.from_bytes(t.Sample, t.to_bytes(s)); j = t.from_json(t.Sample, t.to_json(s))
assert b.parts[0].segment.latents.tobytes() == j.parts[0].segment.latents.tobytes() == s.parts[0].segment.latents.tobytes()
print("ok")
"""


def _uv() -> str | None:
    cand = Path(sys.executable).with_name("uv")
    return str(cand) if cand.exists() else shutil.which("uv")


@pytest.mark.slow
def test_fresh_venv_without_torch(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    py = venv / "bin" / "python"
    uv = _uv()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    if uv:
        subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], check=True, env=env)
        subprocess.run([uv, "pip", "install", "-q", "--python", str(py), str(PKG)], check=True, env=env)
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
        subprocess.run([str(py), "-m", "pip", "install", "-q", str(PKG)], check=True, env=env)
    out = subprocess.run(
        [str(py), "-c", SCRIPT], check=True, capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert out.stdout.strip() == "ok"
