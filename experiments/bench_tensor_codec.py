"""Issue 26 item 5: the data plane's own tensor codec (JSON metas + raw byte views) against
safetensors bytes (``safetensors.torch.save`` / ``load``), on the same tensors in the same process.

    python experiments/bench_tensor_codec.py [--ray]      # docs/benchmarks.md, "Hand-written or a library"

Each path moves a dict of rollout-sized tensors (latents, log-probs, token ids; bf16 / fp32 / int64)
from a producer to a consumer and returns fresh, writable tensors; the result is checked equal.
``--ray`` also times both through the Ray object store (``ray.put`` in the driver, ``ray.get``).
Prints the median of 5 round trips per path and the ratio.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch
from safetensors.torch import load, save

from unirl.distributed.transport import InProcessTransport, ObjectStoreTransport


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
    store = InProcessTransport()
    rows = {
        "ours, in process": median_s(lambda: store.get(store.put(tensors)), tensors),
        "safetensors bytes, in process": median_s(lambda: load(save(tensors)), tensors),
    }
    if "--ray" in sys.argv:
        import ray

        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)

        ray_store = ObjectStoreTransport()
        rows["ours, Ray object store"] = median_s(lambda: ray_store.get(ray_store.put(tensors)), tensors)
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
