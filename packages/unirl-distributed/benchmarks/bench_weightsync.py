"""Bandwidth micro-benchmark of the weight plane between two Ray actors (CPU), one row per
``sync:`` kind that runs on CPU, each built from its config as a run builds it.

    PYTHONPATH=packages/unirl-types/src:packages/unirl-distributed/src \\
        .venv/bin/python packages/unirl-distributed/benchmarks/bench_weightsync.py --mb 64 --repeats 3

Prints MB/s (1 MB = 1e6 bytes, median of ``--repeats``) for each path and its ratio to an
in-process ``torch.clone`` of the same bytes measured in the same run (the memcpy ceiling).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch


class Peer:
    """One side of each transfer; payload built once per size."""

    def __init__(self, mb: int) -> None:
        torch.set_num_threads(1)
        n = mb * 1_000_000 // 4 // 16
        self.params = [(f"layer{i}.weight", torch.randn(n)) for i in range(16)]
        self.group: Any = None
        self.sync: Any = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.params)

    def master(self) -> tuple[str, int]:
        from unirl.distributed.collective import pick_master

        return pick_master()

    def join(self, addr: str, port: int, rank: int) -> None:
        from unirl.distributed.collective import StandaloneGroup

        self.group = StandaloneGroup("gloo", addr, port, rank, 2)

    def make_sync(self, kind: str, source: bool) -> None:
        from pydantic import TypeAdapter

        from unirl.distributed.weightsync import Endpoint, SyncConfig

        cfg = TypeAdapter(SyncConfig).validate_python({"kind": kind, "max_bucket_bytes": 64 * 1024 * 1024})
        self.sync = cfg.build(Endpoint("peer", is_source=source, group=self.group))
        self.version = 0

    def push(self) -> Any:
        self.version += 1
        return self.sync.push(self.params, self.version)

    def pull(self, ticket: Any) -> Any:
        return self.sync.receive(ticket, lambda bucket: None)

    def confirm(self, ticket: Any, ack: Any) -> None:
        self.sync.confirm(ticket, [ack], 1)


def median_mbps(fn: Any, nbytes: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / 1e6 / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=64, help="payload size in MB (1e6 bytes)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import ray

    src = [
        str(Path(__file__).resolve().parents[1] / "src"),
        str(Path(__file__).resolve().parents[2] / "unirl-types/src"),
    ]
    os.environ["PYTHONPATH"] = os.pathsep.join([*src, os.environ.get("PYTHONPATH", "")])
    sys.path[:0] = src
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    actor = ray.remote(num_cpus=0.5)(Peer)
    a, b = actor.remote(args.mb), actor.remote(args.mb)
    nbytes = ray.get(a.nbytes.remote())
    ray.get(b.nbytes.remote())

    local = dict(Peer(args.mb).params)
    base = median_mbps(lambda: [t.clone() for t in local.values()], nbytes, args.repeats)
    rows = [("in-process torch.clone (baseline)", base)]

    addr, port = ray.get(a.master.remote())
    ray.get([a.join.remote(addr, port, 0), b.join.remote(addr, port, 1)])

    for kind in ("buckets", "shm", "broadcast"):
        ray.get([a.make_sync.remote(kind, True), b.make_sync.remote(kind, False)])

        def sync(kind: str = kind) -> None:
            if kind == "broadcast":
                t_ref = a.push.remote()
                ack = ray.get(b.pull.remote(None))
                ticket = ray.get(t_ref)
            else:
                ticket = ray.get(a.push.remote())
                ack = ray.get(b.pull.remote(ticket))
            ray.get(a.confirm.remote(ticket, ack))

        rows.append((f"weight sync {kind} (verified)", median_mbps(sync, nbytes, args.repeats)))

    print(
        f"payload {nbytes / 1e6:.1f} MB in 16 float32 tensors, median of {args.repeats}, torch {torch.__version__}"
    )
    for name, mbps in rows:
        print(f"{name:<48} {mbps:10.1f} MB/s   x{mbps / base:.3f} of baseline")
    ray.shutdown()


if __name__ == "__main__":
    main()
