"""World size 2 (gloo, CPU, two processes) vs world size 1: same parameters after train_on.

Each rank trains on its half of the shard; BatchTotals are summed over ranks and FSDP2
reduce-scatters the gradients, so the result must match one rank training on the whole batch.
Also checks a checkpoint save/load round trip across two ranks. Slow: spawns processes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def _train(tiny, rank: int, world: int, out_dir: str, defer: bool = False) -> dict:
    from unirl.train import checkpoint as ckpt
    from unirl.train.backends.fsdp import FSDPConfig
    from unirl.train.ema import EMAConfig
    from unirl.train.geometry import BatchGeometry
    from unirl.train.optim import AdamWConfig
    from unirl.train.stack import TrainStack

    torch.manual_seed(0)
    cfg = FSDPConfig(
        optimizer=AdamWConfig(lr=0.05), grad_clip=0.5, ema=EMAConfig(decay=0.9), defer_grad_sync=defer
    )
    backend = cfg.build(tiny.BigramPolicy(), "cpu")
    stack = TrainStack(
        backend,
        tiny.TokenPPO(),
        tiny.TokenPipeline(backend.module),
        BatchGeometry(micro_batch_size=2, num_updates_per_batch=2),
    )
    parts = tiny.token_parts(8)
    per_rank = len(parts) // world
    metrics = stack.train_on(parts[rank * per_rank : (rank + 1) * per_rank])
    full = backend.full_state_dict()
    path = ckpt.save_checkpoint(Path(out_dir) / f"ckpt-ws{world}-{defer}", backend, extra={"cursor": 8})
    extra = ckpt.load_checkpoint(path, backend)
    return {
        "params": full,
        "grad_norm": torch.tensor(metrics["grad_norm"]),
        "loss": torch.tensor(metrics["loss"]),
        "cursor": extra["cursor"],
    }


def _worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    import conftest as tiny  # the helpers, imported as a plain module in the child

    results = {f"defer={d}": _train(tiny, rank, world, out_dir, defer=d) for d in (False, True)}
    if rank == 0:
        torch.save(results, Path(out_dir) / f"ws{world}.pt")
    tiny.leave_world()  # an exception above ends the process anyway (spawn reports it)


def test_world_size_two_matches_one(tiny, tmp_path: Path) -> None:
    one = _train(tiny, 0, 1, str(tmp_path))  # in this process (world size 1)
    mp.start_processes(
        _worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    for two in torch.load(tmp_path / "ws2.pt", weights_only=True).values():  # per-micro and deferred sync
        _check_same(one, two)


def _check_same(one: dict, two: dict) -> None:
    assert two["cursor"] == 8
    assert float(two["grad_norm"]) == pytest.approx(float(one["grad_norm"]), rel=1e-5)
    assert float(two["loss"]) == pytest.approx(float(one["loss"]), rel=1e-5, abs=1e-7)
    for k, v in one["params"].items():
        torch.testing.assert_close(two["params"][k], v, atol=1e-6, rtol=0)
