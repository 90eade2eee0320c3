"""SIGKILL after the first checkpoint, rerun with the same run dir: the same parameters as a run never killed.

Single process, through the CLI in subprocesses (the real entry point): the killed run resumes from
``checkpoints/latest`` (weights, optimizer, schedule, RNG, RL step), skips the pre-RL evaluations
and continues; its final checkpoint must equal the uninterrupted run's bit for bit (CPU, one thread),
its metrics hold each step once and its report the stages from before the kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from unirl.apps.config import load_dict

pytestmark = pytest.mark.slow

UNIRL = Path(sys.executable).with_name("unirl")
STEPS = 8
OVERRIDES = [
    "device=cpu",
    "threads=1",
    "checkpoint_every=1",
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.intermediate_size=64",
    "sft.steps=2",
    "sft.batch_size=8",
    f"rl.steps={STEPS}",
    "rl.prompts_per_step=2",
    "rl.samples_per_prompt=4",
    "rl.lr=0.01",
    "rl.geometry.micro_batch_size=4",
    "eval.num_prompts=2",
    "eval.grid_size=0",
]


def write_recipe(tmp: Path) -> Path:
    data = load_dict("arithmetic_grpo", OVERRIDES)
    data["reward"] = {
        "scorers": [{"name": "exact", "weight": 1.0, "scorer": {"kind": "exact_match", "extractor": "raw"}}]
    }
    path = tmp / "tiny_arith.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start(recipe: Path, run_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("ab") as f:
        return subprocess.Popen(
            [str(UNIRL), "train", str(recipe), "--run-dir", str(run_dir)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
        )


def final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run_dir / "checkpoints" / "latest" / "state.pt", map_location="cpu", weights_only=True)
    return state["model"]


def _rl_step(checkpoint: Path) -> int:
    """The RL step a complete checkpoint was written at; -1 while there is none."""
    try:
        json.loads((checkpoint / "meta.json").read_text())
        return int(json.loads((checkpoint / "extra.json").read_text())["rl_step"])
    except (OSError, ValueError, KeyError):
        return -1


def test_sigkill_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path)
    full, cut = tmp_path / "full", tmp_path / "cut"
    ref = start(recipe, full, tmp_path / "full.log")
    victim = start(recipe, cut, tmp_path / "cut.log")
    latest = cut / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    while _rl_step(latest) < 1:  # the first RL checkpoint (rl_step 1; the SFT result's is rl_step 0)
        assert victim.poll() is None, (tmp_path / "cut.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait(60) == -signal.SIGKILL
    killed_at = _rl_step(latest)
    assert 1 <= killed_at < STEPS  # killed mid-RL, not after the run
    resumed = start(recipe, cut, tmp_path / "cut.log")
    assert resumed.wait(300) == 0, (tmp_path / "cut.log").read_text()[-2000:]
    assert ref.wait(300) == 0, (tmp_path / "full.log").read_text()[-2000:]
    assert f"at rl step {killed_at}" in (tmp_path / "cut.log").read_text()  # it did resume
    a, b = final_model(full), final_model(cut)
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [json.loads(x) for x in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["phase"] == "rl"] == list(range(STEPS))  # each step once
    assert [(r["phase"], r["step"]) for r in steps] == [
        (r["phase"], r["step"]) for r in map(json.loads, (full / "metrics.jsonl").read_text().splitlines())
    ]
    report = (cut / "report.md").read_text()  # the whole run's history, not only what came after the kill
    assert all(f"| {stage} |" in report for stage in ("init", "sft", "rl")) and "**rl vs sft: " in report
