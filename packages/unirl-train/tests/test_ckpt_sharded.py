"""Sharded checkpoints: per-rank safetensors + JSON, atomic, resumable, reshardable, never pickled.

- world size 1: resume from a sharded checkpoint is bit-identical to the uninterrupted run;
- a truncated or half-renamed checkpoint is never taken as the latest;
- world size 2 (gloo, two processes): save mid-run, the processes exit, fresh processes resume
  and end where the uninterrupted run ends; the same checkpoint resumed by ONE rank (resharding
  2 -> 1) matches too within float tolerance, and a one-rank checkpoint loads into two ranks.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from unirl.train import checkpoint as ckpt
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.ema import EMAConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.lora import LoRAConfig
from unirl.train.optim import AdamWConfig, CosineSchedule
from unirl.train.sharded_checkpoint import consolidate
from unirl.train.stack import TrainStack

HERE = Path(__file__).resolve().parent
CONFIGS = {
    "full": FSDPConfig(
        optimizer=AdamWConfig(lr=0.05, weight_decay=0.01),
        ema=EMAConfig(decay=0.9),
        scheduler=CosineSchedule(total_steps=10, warmup_steps=2, min_lr_ratio=0.1),
    ),
    # r=1: lora_A has one row, so on two ranks one rank holds an empty shard
    "lora": FSDPConfig(
        optimizer=AdamWConfig(lr=0.05),
        ema=EMAConfig(decay=0.5),
        lora=LoRAConfig(r=1, alpha=2.0, target_modules=["head"]),
    ),
}


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def build(tiny: Any, kind: str) -> tuple[Any, TrainStack]:
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    backend = CONFIGS[kind].build(tiny.BigramPolicy(), "cpu")
    # one mini-batch per update (no mini_batch_size), so 1 rank x 8 Parts == 2 ranks x 4 Parts
    geometry = BatchGeometry(micro_batch_size=2, num_updates_per_batch=2)
    return backend, TrainStack(backend, tiny.TokenPPO(), tiny.TokenPipeline(backend.module), geometry)


def one_round(tiny: Any, stack: TrainStack, rank: int = 0, world: int = 1) -> float:
    """This rank's share of 8 Parts drawn from the torch / numpy / python RNGs (same on every rank)."""
    parts = tiny.token_parts(8, seed=int(torch.randint(0, 10_000, ())))
    for p in parts:
        p.advantage = float(np.random.randn()) + random.random()
    per = len(parts) // world
    return float(stack.train_on(parts[rank * per : (rank + 1) * per])["loss"])


def state(backend: Any) -> dict[str, torch.Tensor]:
    out = {f"p/{n}": full(p) for n, p in backend.module.named_parameters()}
    out.update({f"ema/{n}": full(t) for n, t in backend.ema.shadow.items()})
    names = {id(p): n for n, p in backend.module.named_parameters()}
    for p, st in backend.optimizer.state.items():
        for k, v in st.items():
            out[f"opt/{names[id(p)]}/{k}"] = full(v)
    return out


# ---- world size 1 -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["full", "lora"])
def test_sharded_resume_is_bit_identical(tiny: Any, tmp_path: Path, kind: str) -> None:
    backend, stack = build(tiny, kind)
    one_round(tiny, stack)
    ckpt.save_checkpoint(tmp_path / "c", backend, extra={"rl_step": 1, "weight_version": 2}, format="sharded")
    tail_a = [one_round(tiny, stack) for _ in range(2)]
    want = state(backend)

    torch.manual_seed(123)  # scramble the RNGs: the checkpoint must restore them
    np.random.seed(123)
    random.seed(123)
    backend_b, stack_b = build(tiny, kind)
    assert ckpt.load_checkpoint(tmp_path / "c", backend_b) == {"rl_step": 1, "weight_version": 2}
    assert backend_b.global_step == 2
    tail_b = [one_round(tiny, stack_b) for _ in range(2)]
    assert tail_b == tail_a
    got = state(backend_b)
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_sharded_files_are_safetensors_and_json_only(tiny: Any, tmp_path: Path) -> None:
    backend, stack = build(tiny, "lora")
    one_round(tiny, stack)
    path = ckpt.save_checkpoint(tmp_path / "c", backend, format="sharded")
    names = sorted(p.name for p in path.iterdir())
    assert names == ["extra.json", "index.json", "meta.json", "rank-00000.safetensors"]
    meta = json.loads((path / "meta.json").read_text())
    assert meta["format"] == "sharded" and meta["world_size"] == 1 and meta["global_step"] == 2
    assert set(meta["files"]) == {"extra.json", "index.json", "rank-00000.safetensors"}
    tensors = consolidate(path)  # LoRA: only adapter weights are saved (frozen base comes from the model)
    model = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
    assert model and all("lora_" in k for k in model)
    for n, p in backend.module.named_parameters():
        if p.requires_grad:
            assert torch.equal(model[n], full(p)), n
    with pytest.raises(ValueError, match="same lora config"):
        ckpt.load_checkpoint(path, build(tiny, "full")[0])


def test_partial_checkpoint_is_never_the_latest(tiny: Any, tmp_path: Path) -> None:
    backend, stack = build(tiny, "full")
    slot = tmp_path / "latest"
    ckpt.save_checkpoint(slot, backend, extra={"rl_step": 0}, format="sharded")
    one_round(tiny, stack)
    assert ckpt.latest_complete(slot) == slot
    # a later save that died after writing the shards but before meta.json: not a checkpoint
    tmp = tmp_path / "latest.tmp-2"
    tmp.mkdir()
    (tmp / "rank-00000.safetensors").write_bytes(b"\0" * 64)
    assert ckpt.latest_complete(slot) == slot
    # truncated shard under a complete-looking meta.json: not a checkpoint, and load refuses it
    ckpt.save_checkpoint(tmp_path / "other", backend, extra={"rl_step": 1}, format="sharded")
    shard = tmp_path / "other" / "rank-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    assert ckpt.latest_complete(tmp_path / "other") is None
    with pytest.raises(ValueError, match="incomplete: rank-00000.safetensors has"):
        ckpt.load_checkpoint(tmp_path / "other", backend)
    # the crash window of the rename: `latest` moved aside, the finished new one not renamed yet
    ckpt.save_checkpoint(tmp_path / "done", backend, extra={"rl_step": 1}, format="sharded")
    slot.rename(tmp_path / "latest.old")
    (tmp_path / "done").rename(tmp_path / "latest.tmp-3")
    assert ckpt.latest_complete(slot) == tmp_path / "latest.tmp-3"  # the higher global step wins
    assert ckpt.load_checkpoint(ckpt.latest_complete(slot), backend) == {"rl_step": 1}
    # the next save puts `latest` back in place and removes what the interrupted saves left
    ckpt.save_checkpoint(slot, backend, extra={"rl_step": 2}, format="sharded")
    assert ckpt.latest_complete(slot) == slot
    assert not list(tmp_path.glob("latest.*"))


# ---- world size 2 -------------------------------------------------------------------------------
def _phase(tiny: Any, rank: int, world: int, out: Path, phase: str) -> dict[str, Any]:
    """'run': 1 round, save sharded, 2 more rounds; 'resume': load that checkpoint, 2 rounds;
    'load1': load the one-rank checkpoint `out/ws1` and report the state."""
    backend, stack = build(tiny, "full")
    if phase == "run":
        one_round(tiny, stack, rank, world)
        ckpt.save_checkpoint(out / f"ws{world}", backend, extra={"rl_step": 1}, format="sharded")
    elif phase == "resume":
        assert ckpt.load_checkpoint(out / "ws2", backend) == {"rl_step": 1}
    else:
        ckpt.load_checkpoint(out / "ws1", backend)
        return {"state": state(backend)}
    losses = [one_round(tiny, stack, rank, world) for _ in range(2)]
    return {"losses": torch.tensor(losses), "state": state(backend)}


def _worker(rank: int, world: int, store: str, out: str, phases: list[str]) -> None:
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    import conftest as tiny  # the helpers, as a plain module in the child

    for phase in phases:
        result = _phase(tiny, rank, world, Path(out), phase)
        if rank == 0:
            torch.save(result, Path(out) / f"{phase}.pt")
    tiny.leave_world()  # an exception above ends the process anyway (spawn reports it)


def _spawn(out: Path, *phases: str) -> list[dict[str, Any]]:
    """Run ``phases`` in two fresh processes (a new world: nothing survives from earlier spawns)."""
    mp.start_processes(
        _worker,
        args=(2, str(out / f"store-{phases[0]}"), str(out), list(phases)),
        nprocs=2,
        start_method="spawn",
    )
    return [torch.load(out / f"{p}.pt", weights_only=True) for p in phases]  # this test's own files


@pytest.mark.slow
def test_two_ranks_resume_and_reshard(tiny: Any, tmp_path: Path) -> None:
    _phase(tiny, 0, 1, tmp_path, "run")  # a one-rank checkpoint ws1 (after one round), for 1 -> 2
    backend, _ = build(tiny, "full")
    ckpt.load_checkpoint(tmp_path / "ws1", backend)
    ws1 = state(backend)

    (run,) = _spawn(tmp_path, "run")  # the uninterrupted run; it also leaves ws2 (after round 1)
    meta = json.loads((tmp_path / "ws2" / "meta.json").read_text())
    assert meta["world_size"] == 2 and "rank-00001.safetensors" in meta["files"]
    resumed, load1 = _spawn(tmp_path, "resume", "load1")  # fresh processes, same world size
    assert torch.equal(resumed["losses"], run["losses"])
    for k, v in run["state"].items():
        assert torch.equal(resumed["state"][k], v), k
    # 1 -> 2: the one-rank checkpoint loads into two ranks exactly
    assert set(load1["state"]) == set(ws1)
    for k, v in ws1.items():
        assert torch.equal(load1["state"][k], v), k
    # 2 -> 1: this process alone resumes the two-rank checkpoint (the gradient sum over ranks
    # becomes one sum: equal up to float rounding)
    one = _phase(tiny, 0, 1, tmp_path, "resume")
    torch.testing.assert_close(one["losses"], run["losses"], rtol=1e-5, atol=1e-7)
    for k, v in run["state"].items():
        torch.testing.assert_close(one["state"][k], v, rtol=1e-5, atol=2e-6, msg=k)
