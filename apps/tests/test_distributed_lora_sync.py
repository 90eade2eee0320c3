"""The rollout worker's adapter-only receive path, in one process (no Ray): a LoRA sync must bring
exactly the rollout copy's adapter tensors; fewer, or a base weight, fails loudly and the version
is not served."""

from __future__ import annotations

import pytest
import torch

from unirl.apps.config import load_dict, validate
from unirl.apps.distributed.recipes import ARLayoutRecipe
from unirl.apps.distributed.workers import RolloutWorker
from unirl.distributed import MeshShape
from unirl.distributed.errors import EmptyWeightSyncError, WeightSyncError
from unirl.distributed.rank import rank_info
from unirl.distributed.weightsync import InProcessBlobStore, LoraOnlySync, TensorBucketSync

EXACT = {"scorers": [{"name": "exact", "weight": 1.0, "scorer": {"kind": "exact_match", "extractor": "raw"}}]}
TINY = [
    "device=cpu",
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.intermediate_size=64",
]
LORA = ["backend.lora.r=2", "backend.lora.alpha=4", "backend.lora.target_modules=[q_proj,v_proj]"]


def worker(*overrides: str, store: InProcessBlobStore | None = None) -> RolloutWorker:
    recipe = validate(ARLayoutRecipe, {**load_dict("arithmetic_grpo", [*TINY, *overrides]), "reward": EXACT})
    w = RolloutWorker(rank_info(MeshShape(dp=1), 0), stage="ar", recipe=recipe, threads=1)
    # the 'buckets' endpoint of setup_sync, over an in-process store instead of Ray's object store
    w.sync = TensorBucketSync(store or InProcessBlobStore(), is_source=False, name="rollout0")
    return w


def test_adapter_only_sync_loads_exactly_the_adapters() -> None:
    store = InProcessBlobStore()
    rollout = worker(*LORA, store=store)
    assert (
        sorted(rollout.adapters) == sorted(n for n in rollout.params if "lora_" in n)
        and len(rollout.adapters) == 4
    )
    source = TensorBucketSync(store, is_source=True, name="trainer")
    trained = {n: torch.randn_like(p) for n, p in rollout.params.items()}
    base_before = {n: p.clone() for n, p in rollout.params.items() if n not in rollout.adapters}

    ticket = LoraOnlySync(source).push(list(trained.items()), 1)
    ack = rollout.pull_adapters(ticket)
    source.confirm(ticket, [ack], 1)  # the acked checksum is the trainer's
    assert ack.version == 1 and ack.num_tensors == 4 and rollout.weight_version() == 1
    for n, p in rollout.params.items():  # adapters replaced, base untouched
        assert torch.equal(p, trained[n] if n in rollout.adapters else base_before[n]), n

    half = [(n, t) for n, t in trained.items() if "q_proj.lora" in n]
    base = next(n for n in trained if n not in rollout.adapters)
    bad = [
        (half, "loaded 2 of 4 adapter tensors"),
        ([(base, trained[base])], f"unknown parameter '{base}' in an adapter-only sync"),
    ]
    for version, (tensors, message) in enumerate(bad, start=2):
        ticket = source.push(tensors, version)
        with pytest.raises(WeightSyncError, match=message):
            rollout.pull_adapters(ticket)
        with pytest.raises(WeightSyncError, match="0 acks for 1 receivers"):
            source.confirm(ticket, [], 1)  # no ack: the trainer side fails too (and frees the payload)
    assert rollout.weight_version() == 1  # neither bad sync is served
    with pytest.raises(EmptyWeightSyncError, match="LoRA is bound to zero modules"):
        LoraOnlySync(source).push([(base, trained[base])], 4)


def test_lora_bound_to_no_module_fails_before_any_sync() -> None:
    with pytest.raises(ValueError, match="matched no module"):
        worker("backend.lora.r=2", "backend.lora.alpha=4", "backend.lora.target_modules=[not_a_module]")
    plain = worker()
    with pytest.raises(WeightSyncError, match="this copy has no LoRA"):
        plain.pull_adapters(None)
