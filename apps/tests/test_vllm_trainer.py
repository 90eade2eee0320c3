"""ARTrainer with `rollout.engine.kind: vllm`: SFT, then RL steps sampled by a real vLLM engine that
receives the trained weights after every optimizer step (`nox -s tests_vllm`)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from unirl.apps import cli
from unirl.apps.run_dir import read_metrics

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# head_dim = 64 / 2 = 32: the smallest head size vLLM's CPU attention supports
TINY = ["model.tiny.hidden_size=64", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1"]


def test_arithmetic_grpo_with_the_vllm_engine(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [
        "train", "arithmetic_grpo", *TINY, "rollout.engine.kind=vllm", "rollout.engine.max_num_seqs=32",
        "sft.steps=40", "sft.batch_size=32", "rl.steps=3", "rl.prompts_per_step=4", "rl.samples_per_prompt=4",
        "rl.geometry.micro_batch_size=16", "eval.num_prompts=8", "eval.grid_size=2", "threads=1",
        "--run-dir", str(run),
    ]  # fmt: skip
    assert cli.main(args) == 0
    rows = read_metrics(run / "metrics.jsonl")
    rl = [r for r in rows if r["phase"] == "rl"]
    assert len(rl) == 3
    # after SFT the engine got v40; every RL step syncs the next version, verified by the canary
    assert [r["weight_sync/version"] for r in rl] == [41.0, 42.0, 43.0]
    assert all(r["weight_sync/canary_gap"] < 1e-4 for r in rl)
    # the engine's log-probs are the trainer's replay: parity, and PPO ratio 1 on the first update
    assert all(r["parity/max_abs_diff"] < 1e-4 for r in rl), [r["parity/max_abs_diff"] for r in rl]
    assert all(abs(r["ratio_mean"] - 1.0) < 1e-4 for r in rl)
    assert (run / "engine_init" / "config.json").exists()
    assert "accuracy" in (run / "report.md").read_text()
