"""Sharded checkpoints of Ray train workers: SIGKILL, resume on 2 ranks == uninterrupted, and on 1.

Two train workers (FSDP2 over gloo) train one RL step, write a sharded checkpoint (one
safetensors file per rank + JSON, no pickle), train a second step (the uninterrupted reference)
and are then SIGKILLed. Fresh workers load the checkpoint and train the second step again: two
of them must reproduce the reference bit for bit, one of them (the checkpoint resharded from 2
ranks to 1) within float rounding (gradient sums over ranks vs one sum).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from unirl.apps.config import load_dict, validate
from unirl.apps.distributed.recipes import ARLayoutRecipe
from unirl.apps.distributed.workers import TrainWorker
from unirl.apps.loop import latest_checkpoint
from unirl.apps.trainers.ar import ARTrainer
from unirl.distributed import MeshShape, RayRemote, split_dp

pytestmark = pytest.mark.slow

EXACT = {"scorers": [{"name": "exact", "weight": 1.0, "scorer": {"kind": "exact_match", "extractor": "raw"}}]}
TINY = [
    "device=cpu",
    "threads=1",
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.intermediate_size=64",
    "sft=null",
    "rl.steps=2",
    "rl.prompts_per_step=2",
    "rl.samples_per_prompt=4",
    "rl.lr=0.01",
    "rl.geometry.micro_batch_size=2",
    "eval.num_prompts=2",
    "checkpoint_format=sharded",
]


def spawn(recipe: ARLayoutRecipe, dp: int, scratch: str, name: str) -> RayRemote[TrainWorker]:
    return RayRemote.spawn(
        partial(TrainWorker, domain=ARTrainer, recipe=recipe, scratch=f"{scratch}/{name}", threads=1),
        name=name,
        mesh=MeshShape(dp=dp),
        cpus_per_worker=0.5,
        startup_timeout_s=300,
        call_timeout_s=300,
    )


def resume_step(
    recipe: ARLayoutRecipe, dp: int, ckpt: Path, batch: list[Any], scratch: str
) -> dict[str, Any]:
    remote = spawn(recipe, dp, scratch, f"resume_dp{dp}")
    try:
        extra = remote.call_all(TrainWorker.load, str(ckpt))
        remote.call_all(TrainWorker.begin, "rl")
        loss = remote.call_dp(TrainWorker.train_on, split_dp(batch, dp))[0]["loss"]
        return {"extra": extra, "loss": loss, "final": remote.call_all(TrainWorker.full_state_dict)[0]}
    finally:
        remote.shutdown()


def test_sharded_checkpoint_sigkill_resume_and_reshard(
    ray_cluster: Any, rl_batches: Any, tmp_path: Path
) -> None:
    recipe = validate(ARLayoutRecipe, {**load_dict("arithmetic_grpo", TINY), "reward": EXACT})
    batches = rl_batches(recipe, 2)
    slot = tmp_path / "checkpoints" / "latest"
    with tempfile.TemporaryDirectory() as scratch:
        run = spawn(recipe, 2, scratch, "run")
        try:
            run.call_all(TrainWorker.begin, "rl")
            run.call_dp(TrainWorker.train_on, split_dp(batches[0], 2))
            run.call_all(TrainWorker.save, str(slot), {"rl_step": 1, "weight_version": 1}, "sharded")
            ref_loss = run.call_dp(TrainWorker.train_on, split_dp(batches[1], 2))[0]["loss"]
            ref = run.call_all(TrainWorker.full_state_dict)[0]
            for pid in run.pids:
                os.kill(pid, signal.SIGKILL)  # a crash: only the checkpoint survives
        finally:
            run.shutdown()
        assert latest_checkpoint(tmp_path) == slot
        meta = json.loads((slot / "meta.json").read_text())
        assert (meta["format"], meta["world_size"], meta["global_step"]) == ("sharded", 2, 1)
        assert sorted(p.suffix for p in slot.iterdir()) == [".json"] * 3 + [".safetensors"] * 2  # no pickle
        with ThreadPoolExecutor(2) as pool:  # start both at once
            two, one = pool.map(lambda dp: resume_step(recipe, dp, slot, batches[1], scratch), [2, 1])
    assert two["extra"] == [{"rl_step": 1, "weight_version": 1}] * 2
    assert two["loss"] == ref_loss
    for k, v in ref.items():
        assert torch.equal(two["final"][k], v), k
    assert one["loss"] == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
    for k, v in ref.items():
        torch.testing.assert_close(one["final"][k], v, atol=2e-6, rtol=1e-5)
