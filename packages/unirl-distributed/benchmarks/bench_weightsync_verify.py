"""What the weight plane's verification costs: syncs of a ~50 MB model with and without checksums (CPU).

    .venv/bin/python packages/unirl-distributed/benchmarks/bench_weightsync_verify.py --repeats 5

For each transport, one sync is ``push`` + ``receive`` into a sink that keeps the tensors (what a
rollout engine's load does), median of ``--repeats``. ``verify=False`` is the baseline measured in
the same run; the cost is (verified - unverified) / unverified. With unirl-apps installed the
in-process async mailbox is measured too: its publish + refresh (a CPU snapshot, a stamp at
publish, one before loading and one after) against the same copies without the stamps.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def model(mb: int) -> list[tuple[str, torch.Tensor]]:
    """Transformer-shaped fp32 tensors: 12 square weights of ``mb / 12`` MB each, plus biases."""
    torch.manual_seed(0)
    side = int((mb * 1_000_000 / 12 / 4) ** 0.5)
    out = []
    for i in range(12):
        out += [(f"blocks.{i}.weight", torch.randn(side, side)), (f"blocks.{i}.bias", torch.randn(side))]
    return out


def median_s(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first-touch page faults, allocator
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_bucketed(kind: str, params: list[tuple[str, torch.Tensor]], repeats: int) -> tuple[float, float]:
    """(unverified, verified) median seconds of one push + receive + confirm."""
    return one_sync_s(kind, params, repeats, verify=False), one_sync_s(kind, params, repeats, verify=True)


def one_sync_s(kind: str, params: list[tuple[str, torch.Tensor]], repeats: int, *, verify: bool) -> float:
    from unirl.distributed.weightsync import InProcessBlobStore, SharedMemoryWeightSync, TensorBucketSync

    store = InProcessBlobStore()

    def make(name: str) -> Any:
        if kind == "tensor_buckets":
            return TensorBucketSync(store, max_bucket_bytes=16_000_000, verify=verify, name=name)
        return SharedMemoryWeightSync(max_bucket_bytes=16_000_000, verify=verify, name=name)

    sender, receiver = make("trainer"), make("engine")
    version = iter(range(1, 1_000_000))

    def one() -> None:
        ticket = sender.push(params, next(version))
        got: dict[str, torch.Tensor] = {}
        sender.confirm(ticket, [receiver.receive(ticket, got.update)], 1)

    return median_s(one, repeats)


def bench_mailbox(params: list[tuple[str, torch.Tensor]], repeats: int) -> tuple[float, float] | None:
    try:
        from unirl.apps.asynchronous.mailbox import RolloutCopy, WeightMailbox
    except ImportError:
        return None
    module = torch.nn.Module()
    for name, t in params:
        module.register_parameter(name.replace(".", "_"), torch.nn.Parameter(torch.zeros_like(t)))
    named = [(n.replace(".", "_"), t) for n, t in params]
    box, copy = WeightMailbox(), RolloutCopy(module)
    version = iter(range(1, 1_000_000))

    def verified() -> None:
        v = next(version)
        box.publish(v, v, named)
        copy.refresh(box, v)

    def bare() -> None:  # the same copies, no stamps
        snap = [(n, t.detach().to("cpu", copy=True)) for n, t in named]
        with torch.no_grad():
            for n, t in snap:
                copy.params[n].copy_(t)

    return median_s(bare, repeats), median_s(verified, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=50, help="model size in MB (1e6 bytes)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (checksums are single-threaded)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    params = model(args.mb)
    nbytes = sum(t.numel() * t.element_size() for _, t in params)
    print(f"model: {len(params)} tensors, {nbytes / 1e6:.1f} MB fp32; median of {args.repeats}")
    print(f"{'path':<16} {'unverified s':>12} {'verified s':>11} {'cost':>7}")
    rows = [(k, bench_bucketed(k, params, args.repeats)) for k in ("tensor_buckets", "shared_memory")]
    mailbox = bench_mailbox(params, args.repeats)
    if mailbox is not None:
        rows.append(("async_mailbox", mailbox))
    for name, (bare, checked) in rows:
        print(f"{name:<16} {bare:>12.3f} {checked:>11.3f} {100 * (checked - bare) / bare:>6.0f}%")


if __name__ == "__main__":
    main()
