"""The tiny arithmetic GRPO recipe on Ray, `colocate` and `separate`, selected by config only.

Two train workers (FSDP2 over gloo) and one rollout worker (trainside pipeline copy). After every
sync the rollout worker's live weights must equal the trainer's (checksums compared by the
controller, and here bit-exactly at the end), the weight version must follow the optimizer step, and
the Parts of each step must carry the version of the weights that sampled them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from unirl.apps.config import load_dict, validate
from unirl.apps.distributed.controller import DistributedRL
from unirl.apps.distributed.recipes import ARLayoutRecipe
from unirl.apps.distributed.run import run
from unirl.apps.distributed.workers import RolloutWorker, TrainWorker
from unirl.apps.loop import StopFlag
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.ar import ARTrainer

pytestmark = pytest.mark.slow

EXACT = {"scorers": [{"name": "exact", "weight": 1.0, "scorer": {"kind": "exact_match", "extractor": "raw"}}]}
TINY = [
    "device=cpu",
    "threads=1",
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.intermediate_size=64",
    "sft.steps=2",
    "sft.batch_size=8",
    "rl.steps=2",
    "rl.prompts_per_step=2",
    "rl.samples_per_prompt=4",
    "rl.geometry.micro_batch_size=2",
    "eval.num_prompts=2",
    "eval.grid_size=2",
    "layout.kind=ray",
    "layout.train_workers=2",
    "layout.rollout_workers=1",
    "layout.cpus_per_device=0.5",
    "layout.verify_weights=true",
]


def tiny_recipe(*overrides: str) -> ARLayoutRecipe:
    data = load_dict("arithmetic_grpo", [*TINY, *overrides])
    data["reward"] = EXACT  # a scorer every version of the shipped recipe has
    return validate(ARLayoutRecipe, data)


MEGATRON = ("backend.kind=megatron", "backend.optimizer.lr=3e-3")  # a new kind starts the section afresh


@pytest.mark.parametrize("backend", [(), MEGATRON], ids=["fsdp", "megatron"])
def test_colocate_rollout_weights_follow_every_sync(ray_cluster: Any, tmp_path: Path, backend: tuple) -> None:
    """The same with either train backend: megatron-core's ranks are data parallel here and send
    Hugging Face-named weights, so the rollout copy and the checks are unchanged."""
    recipe = tiny_recipe("layout.placement=colocate", "layout.sync=buckets", *backend)
    assert recipe.backend.kind == ("megatron" if backend else "fsdp")
    rd = RunDir(tmp_path / "run", recipe.model_dump(mode="json"), tensorboard=False)
    controller = DistributedRL(recipe, rd, ARTrainer, recipe.layout)
    try:
        # one placement group: both roles share its 2 "devices", half each
        assert controller.slabs["train"] is controller.slabs["rollout"]
        assert controller.slabs["train"].used == [1.0, 0.5]
        stop = StopFlag()
        controller.sft(stop)  # 2 optimizer steps, then sync v2
        samples, _ = controller.collect(recipe.rl, controller.data.train_records(), 0)
        assert {s.part("ar").weight_version for s in samples} == {2}  # sampled by the synced SFT policy
        controller.rl(stop)  # 2 RL steps, each followed by a sync
        assert [c["version"] for c in controller.sync_checks] == [2, 3, 4]
        for c in controller.sync_checks:
            assert c["rollout"] == [c["trainer"]]
        assert len({c["trainer"] for c in controller.sync_checks}) == 3  # the weights changed each time
        assert controller.rollout_remote.call_rank0(RolloutWorker.weight_version) == 4
        want = controller.train.call_all(TrainWorker.full_state_dict)[0]
        got = controller.rollout_remote.call_rank0(RolloutWorker.state_dict)
        assert set(got) == set(want)
        for k, v in want.items():
            assert torch.equal(got[k], v), k
    finally:
        controller.shutdown()
        rd.close()


def test_separate_layout_runs_the_recipe_by_config_only(ray_cluster: Any, tmp_path: Path) -> None:
    recipe = tiny_recipe("layout.placement=separate", "layout.sync=broadcast")
    assert run(recipe, tmp_path / "run", recipe_name="arithmetic_grpo") == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [0, 1]
    assert [r["weight_version"] for r in rl] == [3.0, 4.0]  # 2 SFT steps, then one step per RL step
    assert all(r["weights_verified"] == 1.0 for r in rl)
    assert {r["phase"] for r in rows} >= {"sft", "rl", "eval"}
    assert (tmp_path / "run" / "checkpoints" / "latest" / "meta.json").is_file()
    meta = json.loads((tmp_path / "run" / "checkpoints" / "latest" / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["global_step"] == 4
    assert (tmp_path / "run" / "report.md").is_file()
    import ray

    assert ray.util.placement_group_table() and all(  # every slab given back
        g["state"] == "REMOVED" for g in ray.util.placement_group_table().values()
    )


@pytest.mark.parametrize("name", ["sd3_tiny_flowgrpo", "sd3_tiny_flowgrpo_megatron"])
def test_diffusion_recipe_on_two_train_workers(ray_cluster: Any, tmp_path: Path, name: str) -> None:
    """Two data-parallel train ranks (FSDP2, or the SD3 MMDiT on megatron-core: its diffusers-named
    export syncs into the rollout worker's diffusers copy), every sync checksum-verified."""
    from unirl.apps.distributed.recipes import DiffusionLayoutRecipe

    overrides = ["device=cpu", "threads=1", "rl.steps=2", "eval.num_prompts=1", "eval.grid_size=1"]
    overrides += ["layout.kind=ray", "layout.placement=separate", "layout.sync=shm"]
    overrides += ["layout.train_workers=2", "layout.cpus_per_device=0.5", "layout.verify_weights=true"]
    recipe = validate(DiffusionLayoutRecipe, load_dict(name, overrides))
    assert run(recipe, tmp_path / "run", recipe_name=name) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["weight_version"] for r in rl] == [1.0, 2.0]  # one FlowGRPO step per RL step, then a sync
    assert all(r["weights_verified"] == 1.0 and r["num_optimizer_steps"] == 1.0 for r in rl)
    assert (
        json.loads((tmp_path / "run" / "checkpoints" / "latest" / "meta.json").read_text())["world_size"] == 2
    )


LORA = ["backend.lora.r=4", "backend.lora.alpha=8", "backend.lora.target_modules=[q_proj,v_proj]"]


def test_lora_colocate_ships_base_once_then_adapters_only(ray_cluster: Any, tmp_path: Path) -> None:
    recipe = tiny_recipe(*LORA, "layout.placement=colocate", "layout.sync=buckets")
    rd = RunDir(tmp_path / "run", recipe.model_dump(mode="json"), tensorboard=False)
    controller = DistributedRL(recipe, rd, ARTrainer, recipe.layout)
    try:
        stop = StopFlag()
        controller.sft(stop)  # 2 optimizer steps on the adapters, then the first sync (v2: everything)
        controller.rl(stop)  # 2 RL steps, each followed by an adapter-only sync
        checks = controller.sync_checks
        assert [(c["version"], c["scope"]) for c in checks] == [(2, "all"), (3, "adapters"), (4, "adapters")]
        want = controller.train.call_all(TrainWorker.full_state_dict, merge_lora=False)[0]
        adapters = sorted(k for k in want if "lora_" in k)
        assert len(adapters) == 4  # 1 layer x (q_proj, v_proj) x (A, B)
        assert checks[0]["tensors"] > len(adapters)  # base weights too
        assert [c["tensors"] for c in checks[1:]] == [len(adapters)] * 2
        for c in checks:  # the rollout copy's live weights (base + adapters) == the trainer's
            assert c["rollout"] == [c["trainer"]]
        assert len({c["trainer"] for c in checks}) == 3  # each sync carried new adapter values
        got = controller.rollout_remote.call_rank0(RolloutWorker.state_dict)
        assert set(got) == set(want)
        for k, v in want.items():
            assert torch.equal(got[k], v), k
        # peft inits lora_B to zero: non-zero now means the trained adapters reached the rollout copy
        assert all(got[k].abs().max() > 0 for k in adapters if "lora_B" in k)
    finally:
        controller.shutdown()
        rd.close()


def test_lora_separate_broadcast_with_sharded_checkpoint(ray_cluster: Any, tmp_path: Path) -> None:
    args = (
        *LORA,
        "layout.placement=separate",
        "layout.sync=broadcast",
        "checkpoint_format=sharded",
        "sft.steps=1",
    )
    recipe = tiny_recipe(*args)
    assert run(recipe, tmp_path / "run", recipe_name="arithmetic_grpo") == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["weight_version"] for r in rl] == [2.0, 3.0]
    assert all(r["weights_verified"] == 1.0 and r["weight_sync_tensors"] == 4.0 for r in rl)  # adapters only
    slot = tmp_path / "run" / "checkpoints" / "latest"
    meta = json.loads((slot / "meta.json").read_text())
    assert (meta["format"], meta["world_size"], meta["global_step"]) == ("sharded", 2, 3)
    extra = json.loads((slot / "extra.json").read_text())
    cursor = {k: extra[k] for k in ("sft_step", "rl_step", "sft_done", "weight_version")}
    assert cursor == {"sft_step": 1, "rl_step": 2, "sft_done": 0, "weight_version": 3}
    # the controller's run state: the report's history to the end, every metrics row, its global RNGs
    assert [e["name"] for e in extra["report"]["evals"]] == ["init", "sft", "rl"]
    assert extra["metrics_rows"] == len(rows) and set(extra["rng"]) == {"python", "numpy"}
    from unirl.train.sharded_checkpoint import consolidate

    model = [k for k in consolidate(slot) if k.startswith("model/")]
    assert sum("lora_" in k for k in model) == 4
    # the frozen base is not checkpointed; torch's ignore_frozen_params keeps only the alias of the
    # embeddings that the tiny Qwen3 ties its lm_head to
    assert {k for k in model if "lora_" not in k} == {"model/lm_head.weight"}
    # resumed by the controller with one more RL step: the report keeps the stages before the resume
    # (the earlier final evaluation is now rl@2) and each step is logged once
    assert run(tiny_recipe(*args, "rl.steps=3"), tmp_path / "run", recipe_name="arithmetic_grpo") == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "rl"] == [0, 1, 2]
    report = (tmp_path / "run" / "report.md").read_text()
    assert all(f"| {stage} |" in report for stage in ("init", "sft", "rl@2", "rl")), report
