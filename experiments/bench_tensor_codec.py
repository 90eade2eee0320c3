"""Issue 26 item 5: the data plane's own tensor codec (JSON metas + raw byte views) against
safetensors bytes (``safetensors.torch.save`` / ``load``), on the same tensors in the same process.

    python experiments/bench_tensor_codec.py [--ray]      # docs/benchmarks.md, "Hand-written or a library"

Each path moves a dict of rollout-sized tensors (latents, log-probs, token ids; bf16 / fp32 / int64)
from a producer to a consumer and returns fresh, writable tensors; the result is checked equal.
``--ray`` also times both through the Ray object store (``ray.put`` in the driver, ``ray.get``).
Prints the median of 5 round trips per path and the ratio.

``unirl.distributed.transport`` (whose ``ObjectStoreTransport`` this timed) was removed with issue
26 item 1: nothing in the runs used it. ``encode`` / ``decode`` below are its put / get steps,
kept here on the same ``unirl.distributed.codec`` primitives so the recorded numbers stay
reproducible.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from safetensors.torch import load, save

from unirl.distributed.codec import TensorMeta, byte_view, from_bytes


def encode(tensors: dict[str, torch.Tensor]) -> tuple[tuple[TensorMeta, ...], list[np.ndarray[Any, Any]]]:
    """Allow-listed metadata + one raw uint8 byte view per tensor (what travels out of band)."""
    return tuple(TensorMeta.of(k, v) for k, v in tensors.items()), [
        byte_view(v).numpy() for v in tensors.values()
    ]


def decode(metas: tuple[TensorMeta, ...], buffers: list[np.ndarray[Any, Any]]) -> dict[str, torch.Tensor]:
    """Fresh, writable tensors (the store's arrays are read-only views: copied once)."""
    return {m.name: from_bytes(torch.from_numpy(a.copy()), m) for m, a in zip(metas, buffers)}


def in_process(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    metas, buffers = encode(tensors)
    return decode(metas, [b.copy() for b in buffers])  # the in-process store kept copies


def payload() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out: dict[str, torch.Tensor] = {}
    for i in range(16):
        out[f"latents.{i}"] = torch.randn(16, 11, 16, 32, 32, generator=g).to(torch.bfloat16)
        out[f"logprobs.{i}"] = torch.randn(16, 10, generator=g)
        out[f"tokens.{i}"] = torch.randint(0, 150_000, (16, 512), generator=g)
    return out


def median_s(fn: Callable[[], dict[str, torch.Tensor]], ref: dict[str, torch.Tensor]) -> float:
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - t0)
        assert all(torch.equal(got[k], v) for k, v in ref.items())
    return statistics.median(times)


def main() -> None:
    tensors = payload()
    mb = sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20
    rows = {
        "ours, in process": median_s(lambda: in_process(tensors), tensors),
        "safetensors bytes, in process": median_s(lambda: load(save(tensors)), tensors),
    }
    if "--ray" in sys.argv:
        import ray

        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)

        def ours_ray() -> dict[str, torch.Tensor]:
            metas, buffers = encode(tensors)
            return decode(metas, ray.get(ray.put(buffers)))

        rows["ours, Ray object store"] = median_s(ours_ray, tensors)
        rows["safetensors bytes, Ray object store"] = median_s(
            lambda: load(ray.get(ray.put(save(tensors)))), tensors
        )
        ray.shutdown()
    print(f"payload: {len(tensors)} tensors, {mb:.0f} MiB; median of 5 round trips")
    base = rows["ours, in process"]
    for name, s in rows.items():
        print(
            f"{name:40s} {s * 1000:8.1f} ms   {mb / 1024 / s:6.2f} GiB/s   x{s / base:.2f} of ours in process"
        )


if __name__ == "__main__":
    main()
