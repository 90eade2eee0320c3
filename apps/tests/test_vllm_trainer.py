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


def _vllm_args(run: Path, *extra: str) -> list[str]:
    return [
        "train", "arithmetic_grpo", *TINY, "rollout.engine.kind=vllm", "rollout.engine.max_num_seqs=32",
        "sft.steps=40", "sft.batch_size=32", "rl.steps=4", "rl.prompts_per_step=4", "rl.samples_per_prompt=4",
        "rl.geometry.micro_batch_size=16", "eval.num_prompts=8", "eval.grid_size=2", "eval.every=2",
        "threads=1", *extra, "--run-dir", str(run),
    ]  # fmt: skip


def test_async_with_the_vllm_engine(tmp_path: Path) -> None:
    """`rl.lifecycle: async` on one process with vLLM: the rollout thread feeds the engine each new
    policy through the engine weight plane (stamp, changed parameters, canary against a rollout
    copy at the engine's version). With `max_staleness: 0` it is the synchronous run: the same
    tokens, rewards and evaluations. With the default bound (1) batches are one version old, and
    the engine's log-probs still equal the replay of the copy it was fed from (parity)."""
    assert cli.main(_vllm_args(tmp_path / "sync")) == 0
    zero = ["rl.lifecycle=async", "rl.buffer.max_staleness=0", "rl.buffer.capacity=1"]
    assert cli.main(_vllm_args(tmp_path / "async0", *zero)) == 0
    assert cli.main(_vllm_args(tmp_path / "async1", "rl.lifecycle=async")) == 0

    def rows(run: str, phase: str) -> list[dict]:
        by_step = {
            r["step"]: r for r in read_metrics(tmp_path / run / "metrics.jsonl") if r["phase"] == phase
        }
        return [by_step[k] for k in sorted(by_step)]

    for phase in ("rl", "eval"):
        a, b = rows("sync", phase), rows("async0", phase)
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            for k in ("reward_mean", "reward_std", "groups_with_signal", "eval_accuracy", "eval_reward_mean"):
                if k in x:
                    assert y[k] == x[k], (phase, k, x["step"])
            if "loss" in x:
                assert y["loss"] == pytest.approx(x["loss"], rel=1e-4, abs=1e-6)
    zero_rl = rows("async0", "rl")
    assert [r["async/staleness"] for r in zero_rl] == [0.0] * 4
    assert all(abs(r["ratio_mean"] - 1.0) < 1e-4 for r in zero_rl)  # on-policy through the engine
    one = rows("async1", "rl")
    assert len(one) == 4 and max(r["async/staleness"] for r in one) == 1.0
    last = one[-1]  # produced = trained + dropped + buffered
    assert last["async/produced"] == last["async/trained"] + last["async/dropped"] + last["async/buffered"]
    assert last["async/trained"] == 4
    for r in zero_rl + one:  # the engine's log-probs equal the replay of the copy it was fed from
        assert r["parity/max_abs_diff"] < 1e-4, r["parity/max_abs_diff"]
    gaps = [r["weight_sync/canary_gap"] for r in one if "weight_sync/canary_gap" in r]
    assert gaps and max(gaps) < 1e-4
    report = (tmp_path / "async1" / "report.md").read_text()
    assert "## Async lifecycle" in report and "accuracy" in report
