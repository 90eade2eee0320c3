"""The async lifecycle end to end (tiny arithmetic world): zero staleness is the sync run, bounded
staleness is kept, and a kill -9 inside a rollout or a train step resumes with nothing lost or
trained twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from unirl.apps import cli
from unirl.apps.asynchronous.source import FAULT_ENV
from unirl.apps.config import RecipeError, load
from unirl.apps.run_dir import read_metrics
from unirl.apps.trainers.ar import Recipe

SHORT = ("sft.steps=60", "rl.steps=8", "eval.num_prompts=24", "threads=1")
SHAPES_SHORT = (
    "sft.steps=20",
    "rl.steps=4",
    "eval.num_prompts=4",
    "eval.samples_per_prompt=2",
    "eval.every=0",
)
# the prompt enhancer at the kill sweep's sizes (scripts/kill_sweep.py, preset shapes_pe)
PE_SHORT = ("device=cpu", "threads=1", "ar.model.tiny.hidden_size=32", "ar.model.tiny.intermediate_size=64",
            "ar.model.tiny.num_layers=1", "ar.sampling.max_new_tokens=8", "diffusion.model.unet_channels=8",
            "diffusion.model.unet_text_layers=1", "diffusion.sampling.num_steps=4",
            "reward.scorers.0.scorer.reward=score", "diffusion.sft.steps=4", "diffusion.sft.batch_size=8",
            "ar.sft.steps=4", "ar.sft.batch_size=8", "rl.steps=8", "rl.prompts_per_step=2",
            "rl.samples_per_prompt=4", "rl.images_per_rewrite=2", "ar.rl.geometry.micro_batch_size=8",
            "diffusion.rl.algorithm.kind=flow_grpo", "diffusion.rl.geometry.micro_batch_size=16",
            "eval.num_prompts=2", "eval.samples_per_prompt=1", "eval.grid_size=0", "eval.every=0")  # fmt: skip
ASYNC = ("rl.lifecycle=async",)
# metrics that differ by design: wall times, and the async lifecycle's own
_TIMING = ("time", "seconds", "_s")


def _rows(run: Path, phase: str) -> list[dict]:
    """The last row logged for each step of ``phase`` (a resumed run re-logs the steps it redoes)."""
    by_step = {r["step"]: r for r in read_metrics(run / "metrics.jsonl") if r["phase"] == phase}
    return [by_step[k] for k in sorted(by_step)]


def _train(run: Path, *overrides: str, recipe: str = "arithmetic_grpo") -> None:
    short = SHORT if recipe == "arithmetic_grpo" else SHAPES_SHORT
    if recipe == "shapes_unified":
        short = (*SHAPES_SHORT, "threads=1")
    if recipe == "shapes_pe":
        short = PE_SHORT
    assert cli.main(["train", recipe, *short, *overrides, "--run-dir", str(run)]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["arithmetic_grpo", "shapes_nft", "shapes_unified", "shapes_pe"])
def test_zero_staleness_reproduces_the_sync_run(tmp_path: Path, recipe: str) -> None:
    """Same prompts, samples, rewards and evaluations. The diffusion run is bit for bit the same;
    the AR one has the same tokens, and losses and gradients to float rounding: its rollout copy is
    a plain module, the trained one FSDP2-wrapped, and their log-probs differ in the last bits
    (~2e-7; the diffusion pipeline's do not)."""
    _train(tmp_path / "sync", recipe=recipe)
    _train(tmp_path / "async", *ASYNC, "rl.buffer.max_staleness=0", "rl.buffer.capacity=1", recipe=recipe)
    for phase in ("rl", "eval"):
        a, b = _rows(tmp_path / "sync", phase), _rows(tmp_path / "async", phase)
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            for k, v in x.items():
                if k.startswith("async/") or k.endswith(_TIMING):
                    continue
                exact = (
                    recipe == "shapes_nft"
                    or isinstance(v, str)
                    or k.startswith(("reward", "eval_", "groups"))
                )
                assert y[k] == v if exact else y[k] == pytest.approx(v, rel=1e-4, abs=1e-6), (phase, k)
    rl = _rows(tmp_path / "async", "rl")
    assert [r["async/staleness"] for r in rl] == [0.0] * len(rl)
    assert [r["async/slot"] for r in rl] == list(range(len(rl)))


def _accounting(row: dict) -> None:
    produced, trained = row["async/produced"], row["async/trained"]
    assert produced == trained + row["async/dropped"] + row["async/buffered"], row


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "where"),
    [
        ("arithmetic_grpo", "rollout:5"),
        ("arithmetic_grpo", "train:4"),
        ("shapes_unified", "rollout:5"),
        ("shapes_pe", "train:4"),
    ],
)
def test_kill9_then_resume_loses_nothing_and_trains_nothing_twice(
    tmp_path: Path, recipe: str, where: str
) -> None:
    run = tmp_path / "run"
    short = {"arithmetic_grpo": SHORT, "shapes_pe": PE_SHORT}.get(
        recipe, (*SHAPES_SHORT, "threads=1", "rl.steps=8")
    )
    args = ["train", recipe, *short, *ASYNC, "rl.buffer.max_staleness=2", "rl.buffer.capacity=3",
            "checkpoint_every=2", "--run-dir", str(run)]  # fmt: skip
    code = "import sys; from unirl.apps.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, FAULT_ENV: where}
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, timeout=600)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    ckpt = json.loads((run / "checkpoints" / "latest" / "extra.json").read_text())
    assert ckpt["rl_step"] in (2, 4) and "async" in ckpt
    buffered = ckpt["async"]["batches"]
    assert ckpt["async"]["produced"] == ckpt["rl_step"] + ckpt["async"]["dropped"] + len(buffered)
    assert cli.main(args) == 0  # resume
    rl = _rows(run, "rl")
    assert [r["step"] for r in rl] == list(range(8))
    slots = [int(r["async/slot"]) for r in rl]
    assert slots == sorted(set(slots)), f"a slot trained twice or out of order: {slots}"
    assert all(r["async/staleness"] <= 2 for r in rl)
    # the batches buffered at the checkpoint were trained after the resume, not sampled again
    assert {int(b["slot"]) for b in buffered} <= set(slots[ckpt["rl_step"] :])
    _accounting(rl[-1])
    assert rl[-1]["async/trained"] == 8
    evals = [r for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "eval"]
    assert evals, "no evaluation after the resumed run"
    report = (run / "report.md").read_text()
    assert "## Async lifecycle" in report and f"produced {rl[-1]['async/produced']:.0f} = trained 8" in report
    assert (run / "plots" / "async.png").exists()


def test_async_refuses_what_it_cannot_run() -> None:
    with pytest.raises(RecipeError, match="use sync='buckets' or 'shm'"):
        load(Recipe, "arithmetic_grpo", [*ASYNC, "layout.kind=ray", "layout.sync=broadcast"])
    vllm = [*ASYNC, "rollout.engine.kind=vllm"]
    assert (
        load(Recipe, "arithmetic_grpo", vllm).rollout.engine.kind == "vllm"
    )  # one process: fed by the rollout thread
    with pytest.raises(RecipeError, match="cannot take new weights mid-sequence"):
        load(Recipe, "arithmetic_grpo", [*vllm, "rl.buffer.partial_rollouts=true"])
    with pytest.raises(RecipeError, match="rl.buffer.max_staleness"):
        load(Recipe, "arithmetic_grpo", [*ASYNC, "rl.buffer.max_staleness=-1"])


RAY = ("layout.kind=ray", "layout.placement=separate", "layout.sync=buckets", "layout.cpus_per_device=0.5")


@pytest.mark.slow
def test_ray_layout_async_is_the_one_process_run_and_keeps_its_bounds(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """Rollout and train workers in their own processes: at zero staleness the run is the
    one-process async run bit for bit (both sample with a plain rollout copy); at the default bound
    rollout runs one version ahead, pulling each version between batches."""
    zero = (*ASYNC, "rl.buffer.max_staleness=0", "rl.buffer.capacity=1")
    _train(tmp_path / "local", *zero)
    _train(tmp_path / "ray", *zero, *RAY)
    for phase in ("rl", "eval"):
        a, b = _rows(tmp_path / "local", phase), _rows(tmp_path / "ray", phase)
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            assert {k: v for k, v in x.items() if not k.endswith(_TIMING) and not k.startswith("async/")} == {
                k: y[k] for k in x if not k.endswith(_TIMING) and not k.startswith("async/")
            }, phase
    _train(tmp_path / "ray1", *ASYNC, *RAY, "checkpoint_every=4")
    rl = _rows(tmp_path / "ray1", "rl")
    assert [int(r["async/slot"]) for r in rl] == list(range(8))
    assert all(r["async/staleness"] <= 1 for r in rl) and any(r["async/staleness"] == 1 for r in rl)
    for r in rl:
        _accounting(r)
    ckpt = json.loads((tmp_path / "ray1" / "checkpoints" / "latest" / "extra.json").read_text())
    assert ckpt["async"]["trained"] == 8 and ckpt["async"]["produced"] == 8


@pytest.mark.slow
def test_ray_layout_partial_rollouts_keep_the_bounds_and_free_every_version(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """Two rollout workers take each published policy from the run's weight board, also between
    decode steps (``rl.buffer.partial_rollouts``): the bound counts from the oldest token and the
    run trains and checkpoints as without. Whether a publication lands mid-generation here depends
    on timing; the swap itself is tested deterministically in test_weight_board.py."""
    run = tmp_path / "partial"
    _train(run, *ASYNC, *RAY, "layout.rollout_workers=2", "rl.buffer.partial_rollouts=true",
           "rl.buffer.partial_chunk_tokens=1", "rl.algorithm.old_logprobs=recompute",
           "rl.algorithm.off_policy={mode: truncate, cap: 2.0}", "checkpoint_every=4")  # fmt: skip
    rl = _rows(run, "rl")
    assert [int(r["async/slot"]) for r in rl] == list(range(8))
    for r in rl:
        _accounting(r)
        assert r["async/staleness"] <= 1 and r["async/sample_staleness_mean"] <= r["async/staleness"]
        assert r["async/token_staleness_mean"] <= r["async/sample_staleness_mean"]
        assert 1.0 <= r["async/versions_per_sample_mean"] <= r["async/versions_per_sample_max"] <= 2.0
        assert (r["async/interrupted_frac"] > 0) == (r["async/versions_per_sample_max"] == 2.0)
        assert 0.0 < r["is_weight_mean"] <= 2.0 and r["grad_norm"] > 0
    ckpt = json.loads((run / "checkpoints" / "latest" / "extra.json").read_text())
    assert ckpt["async"]["trained"] == 8
