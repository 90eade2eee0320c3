"""Decode-step attention on a Qwen3-0.6B-shaped KV cache: which kernel the fused decoder should use.

One token per sequence attends a static cache (batch 64, 8 KV heads x 2 query heads each, head
dim 128, 576 slots, a boolean mask hiding left padding and unfilled slots), once per layer for 28
layers (each layer its own cache, 2.1 GB in all, so the L2 cache does not flatter anyone). Every
variant runs inside a CUDA graph of the 28 calls (as in ``decode_static``) and is checked against
an fp32 reference; times are medians of graph replays. The first variant is the baseline.

    python apps/benchmarks/gpu_decode_attention.py
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

Attn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa(q, k, v, mask):  # type: ignore[no-untyped-def]
    """q [B, KV, G, D] (the G query heads of a KV head as its query rows), mask [B, 1, 1, L]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def sdpa_with(backend: SDPBackend) -> Attn:
    def run(q, k, v, mask):  # type: ignore[no-untyped-def]
        with sdpa_kernel([backend]):
            return sdpa(q, k, v, mask)

    return run


def manual(q, k, v, mask):  # type: ignore[no-untyped-def]
    """Scores and softmax in fp32 (as flash kernels keep them), products on bf16 operands."""
    s = torch.matmul(q, k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    p = s.masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.matmul(p.to(v.dtype), v)


def flex():  # type: ignore[no-untyped-def]
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)

    def run(q, k, v, mask):  # type: ignore[no-untyped-def]
        B, KV, G, D = q.shape
        keep = mask[:, 0, 0]  # [B, L]

        def score_mod(score, b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
            return torch.where(keep[b, kv_idx], score, -float("inf"))

        out = compiled(q.reshape(B, KV * G, 1, D), k, v, score_mod=score_mod, enable_gqa=True)
        return out.reshape(B, KV, G, D)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--slots", type=int, default=576)
    ap.add_argument("--filled", type=int, default=320, help="slots holding keys (the rest are masked)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    B, KV, G, D, L, N = args.batch, 8, 2, 128, args.slots, args.layers
    dev, bf = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(N, B, KV, G, D, device=dev, dtype=bf, generator=gen)
    k = torch.randn(N, B, KV, L, D, device=dev, dtype=bf, generator=gen)
    v = torch.randn(N, B, KV, L, D, device=dev, dtype=bf, generator=gen)
    pad = torch.randint(0, 16, (B,), device=dev, generator=gen)  # left padding per row
    idx = torch.arange(L, device=dev)
    mask = ((idx[None] >= pad[:, None]) & (idx[None] < args.filled))[:, None, None, :]
    ref = manual(q[0].double(), k[0].double(), v[0].double(), mask)
    variants: dict[str, Attn] = {
        "sdpa (default: cuDNN)": sdpa,
        "sdpa efficient": sdpa_with(SDPBackend.EFFICIENT_ATTENTION),
        "sdpa math": sdpa_with(SDPBackend.MATH),
        "manual eager": manual,
        "manual compiled": torch.compile(manual, dynamic=False),
        "flex compiled": flex(),
    }
    rows = []
    for name, fn in variants.items():
        try:
            out = torch.empty(N, B, KV, G, D, device=dev, dtype=bf)

            def layers(out: torch.Tensor = out, fn: Attn = fn) -> None:
                for i in range(N):
                    out[i] = fn(q[i], k[i], v[i], mask)

            for _ in range(3):
                layers()
            torch.cuda.synchronize()
            err = ((out[0].double() - ref).norm() / ref.norm()).item()
            graph = torch.cuda.CUDAGraph()
            out.fill_(float("nan"))
            with torch.cuda.graph(graph):
                layers()
            graph.replay()
            torch.cuda.synchronize()
            assert not out.isnan().any(), f"{name}: graph left outputs unwritten"
            times = []
            for _ in range(args.reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3 / N)
            rows.append((name, statistics.median(times), err))
        except Exception as e:
            rows.append((name, float("nan"), float("nan")))
            print(f"{name}: {type(e).__name__}: {str(e)[:200]}")
    gbytes = 2 * B * KV * L * D * 2 / 1e9
    base = rows[0][1]
    print(f"B={B} KV={KV} G={G} D={D} slots={L} filled={args.filled}: {gbytes * 1e3:.0f} MB of K+V per layer")
    print(f"{'variant':<24} {'us/layer':>9} {'GB/s':>7} {'rel err':>9} {'vs base':>8}")
    for name, t, err in rows:
        print(f"{name:<24} {t:9.1f} {gbytes / (t * 1e-6):7.0f} {err:9.1e} {base / t:7.2f}x")


if __name__ == "__main__":
    main()
