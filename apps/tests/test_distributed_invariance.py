"""World size 1 vs 2: Ray train workers (FSDP2 over gloo) give the same parameters after two RL steps.

The same global batch of 8 AR Parts (tiny arithmetic recipe, rollouts sampled once in this
process, rewards 0/1/2 so the GRPO advantages are non-zero) is trained for two steps by one train
worker and by two (each rank gets 4 Parts). Losses are divided by rank-summed totals and FSDP2
sums gradients, so the two runs must agree to float rounding; the parameters must also have moved
(a run that trains nothing would pass trivially). Run with full fine-tuning and with LoRA
adapters (compared unmerged: the adapters themselves, B starting at zero).
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest
import torch

from unirl.apps.config import load_dict, validate
from unirl.apps.distributed.recipes import ARLayoutRecipe
from unirl.apps.distributed.workers import TrainWorker
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
]


def tiny_recipe(*overrides: str) -> ARLayoutRecipe:
    data = load_dict("arithmetic_grpo", [*TINY, *overrides])
    data["reward"] = EXACT  # a scorer every version of the shipped recipe has
    return validate(ARLayoutRecipe, data)


def train_two_steps(
    recipe: ARLayoutRecipe, dp: int, batches: list[list[Any]], scratch: str
) -> dict[str, Any]:
    remote = RayRemote.spawn(
        partial(TrainWorker, domain=ARTrainer, recipe=recipe, scratch=f"{scratch}/dp{dp}", threads=1),
        name=f"train_dp{dp}",
        mesh=MeshShape(dp=dp),
        cpus_per_worker=0.5,
        startup_timeout_s=300,
        call_timeout_s=300,
    )
    try:
        init = remote.call_all(TrainWorker.full_state_dict, merge_lora=False)[0]
        remote.call_all(TrainWorker.begin, "rl")
        losses = [remote.call_dp(TrainWorker.train_on, split_dp(b, dp))[0]["loss"] for b in batches]
        return {
            "init": init,
            "final": remote.call_all(TrainWorker.full_state_dict, merge_lora=False)[0],
            "losses": losses,
        }
    finally:
        remote.shutdown()


LORA = ["backend.lora.r=4", "backend.lora.alpha=8", "backend.lora.target_modules=[q_proj,v_proj]"]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_world_size_two_matches_one(ray_cluster: Any, rl_batches: Any, lora: bool) -> None:
    recipe = tiny_recipe(*(LORA if lora else []))
    batches = rl_batches(recipe, 2)
    # rewards 0,1,2,0 | 1,2,0,1: the two 1s of group 2 sit at its mean (advantage 0), the rest do not
    assert [bool(p.advantage) for p in batches[0]] == [True] * 4 + [False, True, True, False]
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(2) as pool:  # start both at once
        one, two = pool.map(lambda dp: train_two_steps(recipe, dp, batches, scratch), [1, 2])
    assert one["losses"] == pytest.approx(two["losses"], rel=1e-5, abs=1e-7)
    moved = max(float((one["final"][k] - one["init"][k]).abs().max()) for k in one["init"])
    assert moved > 1e-3  # lr 0.01 with non-zero advantages: the policy moved
    for k, v in one["final"].items():
        torch.testing.assert_close(two["final"][k], v, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(two["init"][k], one["init"][k], atol=0, rtol=0)
