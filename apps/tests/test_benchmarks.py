"""The H200 benchmark scripts run end to end on CPU at tiny sizes, so they cannot rot between
device sessions: every code path but CUDA-graph capture and the GPU timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def run(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(BENCH / script), "--tiny", *args],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
def test_flow_grpo_step_benchmark_runs_and_is_on_policy() -> None:
    line = run("gpu_flow_grpo_step.py").strip().splitlines()[-1]
    fields = dict(kv.split("=") for kv in line.split(": ", 1)[1].split())
    assert float(fields["ratio_dev"]) == 0.0  # same shapes in rollout and replay: exactly on-policy
    assert float(fields["trained_steps"]) == 2.0  # int(3 steps * 0.9)
    assert float(fields["samples_per_s"]) > 0


@pytest.mark.slow
def test_grpo_step_benchmark_runs_every_decoder() -> None:
    out = run("gpu_grpo_step.py", "--decoders", "dynamic", "graph:0", "graph:4").strip().splitlines()
    table = out[next(i for i, line in enumerate(out) if line.startswith("decoder ")) :]
    rows = {r.split()[0]: r.split() for r in table[1:]}
    assert set(rows) == {"dynamic", "graph:0", "graph:4"}
    for r in rows.values():
        assert float(r[8]) < 1e-5  # first-update ratio deviation (fp32 on CPU), after the step range
        assert r[9].endswith("%")  # the train phase's MFU
    steps = [line for line in out if line.startswith("graph:4 step ")]
    assert len(steps) == 2 and "train" in steps[0]  # each timed step's phases


@pytest.mark.slow
def test_train_backends_benchmark_agrees_across_backends(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    pytest.importorskip("mbridge")
    out = tmp_path / "backends.json"
    table = run("gpu_train_backends.py", "--backends", "fsdp", "megatron", "--steps", "1", "--json", str(out))
    assert [r.split()[0] for r in table.strip().splitlines()[-2:]] == ["fsdp", "megatron"]
    res = json.loads(out.read_text())["results"]
    fsdp, meg = res["fsdp"], res["megatron"]
    for r in (fsdp, meg):
        assert r["same_initial_weights"] == 1.0
        assert r["first_ratio_dev"] < 1e-5  # fp32 on CPU: replay = rollout
        assert r["optimizer_steps"] == 1.0 and r["global_step"] == 2.0  # warm-up + 1 timed step
        assert r["train_s"] > 0 and r["tokens_per_s"] > 0
    assert meg["logp_maxdiff_vs_base"] < 1e-5  # the same function at the same initial weights
    assert abs(meg["first_grad_norm"] - fsdp["first_grad_norm"]) < 1e-4 * fsdp["first_grad_norm"]
    assert abs(meg["first_loss"] - fsdp["first_loss"]) < 1e-6
