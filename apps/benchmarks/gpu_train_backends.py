"""The train phase of issue 8's GRPO step on each train backend (FSDP2, megatron-core), one GPU.

Issue 18's comparison. The same work as ``gpu_grpo_step.py`` (Qwen3-0.6B architecture, random
init, 8 prompts x 8 samples of 64 prompt tokens, exactly 512 new tokens, full fine-tune AdamW,
micro-batch 16, bf16 compute on CUDA), but the 64 samples are rolled out ONCE, by a bf16 copy of
the initial model (the ``--decoder`` loop), and given seeded random group advantages. Then, for
each backend of ``--backends`` (the first is the baseline), in turn: the model is rebuilt from
the same seed (its weights checked against the rollout model's), the backend is built over it,
one train step is taken as warm-up (its metrics are the "first step": loss, pre-clip grad norm,
max |ratio - 1| against the rollout's log-probs), ``--steps`` more are timed
(``TrainStack.train_on`` between two ``torch.cuda.synchronize``), and the backend is freed
(del + gc + empty_cache) before the next one is built. Peak memory is
``torch.cuda.max_memory_allocated`` from just before the model is built to the end of the
backend's steps (weights, optimizer state, activations; for megatron also its Hugging Face
rollout copy).

Before its first step each backend also replays the samples' log-probs (no grad) at the initial
weights; ``max |dlogp|`` is the largest difference from the baseline backend's replay, the
direct check that the backends compute the same function.

Model FLOPs of one train step (forward + backward = 3 x forward, PaLM's convention: no credit
for causal masking, no recomputation, the input embedding lookup not counted)::

    6 * N_layers * n_seq * S  +  6 * V * d * n_seq * (T + 1)  +  12 * L * (H * d_head) * n_seq * S^2

with N_layers the parameters of the decoder layers and final norm (440M for Qwen3-0.6B), V * d
the (tied) LM head, evaluated at the T + 1 positions the replay keeps (``logits_to_keep``),
S = prompt + new tokens = 576, T = 512, n_seq = 64, L = 28 layers of H = 16 heads x 128.
MFU = model FLOPs / (train seconds x 989 TFLOP/s, the H200's dense bf16 peak). tokens/s counts
every token the step processes (prompt + response: n_seq * S).

    python apps/benchmarks/gpu_train_backends.py --backends fsdp megatron --steps 5 --json out.json
    python apps/benchmarks/gpu_train_backends.py --tiny --backends fsdp megatron   # CPU smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time

import torch

# the script's folder is on sys.path when it runs as a script
from gpu_grpo_step import (
    H200_BF16_PEAK,
    add_step_args,
    apply_tiny,
    make_backend,
    make_model,
    make_samples,
    model_flops,
    profiled,
    random_advantages,
    write_json,
)

from unirl.rollout.ar import ARPipeline
from unirl.rollout.engines import TrainsideEngine
from unirl.train.algorithms import GRPOConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.precision import PrecisionConfig
from unirl.train.stack import TrainStack
from unirl.types import ARSamplingParams


def fingerprint(model: torch.nn.Module) -> float:
    """A float64 checksum of the weights (same seed -> same number)."""
    with torch.no_grad():
        return float(sum((p.double() * (i + 1)).sum() for i, p in enumerate(model.parameters())))


def rollout(
    args: argparse.Namespace, device: torch.device, params: ARSamplingParams
) -> tuple[list, float, float]:
    """(parts with advantages, initial-weight fingerprint, rollout seconds): one rollout of a
    copy of the initial model in the backends' compute dtype."""
    bundle = make_model(args.tiny, device)
    fp = fingerprint(bundle.model)
    bundle.model.to(PrecisionConfig().resolve(device)[0])
    kind, _, bucket = args.decoder.partition(":")
    pipe = ARPipeline(bundle, params, stop_at_eos=False, decoder=kind, kv_bucket=int(bucket or 0))  # type: ignore[arg-type]
    engine = TrainsideEngine(pipe)
    sync(device)
    t = time.perf_counter()
    samples = engine.generate(make_samples(args, bundle), rollout_step=0)
    sync(device)
    seconds = time.perf_counter() - t
    parts = random_advantages(samples, seed=0)
    for p in parts:  # keep nothing of the rollout model alive
        if isinstance(p.segment.log_probs, torch.Tensor):
            p.segment.log_probs = p.segment.log_probs.detach().float().cpu()
    del bundle, pipe, engine, samples
    free(device)
    return parts, fp, seconds


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def ratio_dev(m: dict[str, float]) -> float:
    return max(abs(m["ratio_max"] - 1), abs(1 - m["ratio_min"]))


def run_backend(
    kind: str,
    args: argparse.Namespace,
    device: torch.device,
    params: ARSamplingParams,
    parts: list,
    fp: float,
) -> tuple[dict[str, float], torch.Tensor]:
    """Build ``kind`` from the initial weights, replay once, warm up one step, time ``--steps``."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    resident = torch.cuda.memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    bundle = make_model(args.tiny, device)
    same_init = fingerprint(bundle.model) == fp
    if not same_init:
        print(f"WARNING: {kind}: the rebuilt model's initial weights differ from the rollout model's")
    flops = model_flops(bundle.model, len(parts), args.prompt_tokens, args.new_tokens)
    t = time.perf_counter()
    backend = make_backend(kind, bundle.model, device)
    build_s = time.perf_counter() - t
    pipe = ARPipeline(bundle, params, stop_at_eos=False)
    if backend.module is not bundle.model:  # megatron: replay (and every loss) on the trained module
        pipe.replay_model = backend.module
    with torch.no_grad():
        logp = torch.cat(
            [
                pipe.replay_logprobs(parts[i : i + args.micro]).logp.float().cpu()
                for i in range(0, len(parts), args.micro)
            ]
        )
    stack = TrainStack(backend, GRPOConfig().build(), pipe, BatchGeometry(micro_batch_size=args.micro))
    runs: list[tuple[float, dict[str, float]]] = []
    for _ in range(1 + args.steps):  # the first is the warm-up
        sync(device)
        t = time.perf_counter()
        metrics = stack.train_on(parts)
        sync(device)
        runs.append((time.perf_counter() - t, metrics))
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    if args.profile:
        with profiled(f"train step, {kind}"):
            stack.train_on(parts)
        sync(device)
    first = runs[0][1]
    timed = [s for s, _ in runs[1:]]
    train_s = statistics.median(timed)
    tokens = len(parts) * (args.prompt_tokens + args.new_tokens)
    res = {
        "build_s": build_s,
        "first_train_s": runs[0][0],
        "train_s": train_s,
        "train_s_min": min(timed),
        "train_s_max": max(timed),
        "peak_mem_gib": peak,
        "resident_before_gib": resident,
        "same_initial_weights": float(same_init),
        "tokens": tokens,
        "tokens_per_s": tokens / train_s,
        "model_tflop": flops / 1e12,
        "tflop_per_s": flops / train_s / 1e12,
        "mfu": flops / train_s / H200_BF16_PEAK,
        "first_loss": first["loss"],
        "first_grad_norm": first["grad_norm"],
        "first_ratio_dev": ratio_dev(first),
        "optimizer_steps": first["num_optimizer_steps"],
        "global_step": float(backend.global_step),
    }
    del stack, pipe, backend, bundle
    free(device)
    return res, logp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--backends",
        nargs="+",
        default=["fsdp", "megatron"],
        help="fsdp | megatron | megatron-unfused; first = baseline",
    )
    ap.add_argument(
        "--decoder", default="graph", help="the rollout's decode loop (gpu_grpo_step.py --decoders)"
    )
    add_step_args(ap)
    ap.add_argument("--steps", type=int, default=3, help="timed train steps per backend (after 1 warm-up)")
    ap.add_argument(
        "--profile", action="store_true", help="print the top CUDA kernels of one more step per backend"
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    apply_tiny(args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    params = ARSamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, stop_token_ids=[], seed=0)
    parts, fp, rollout_s = rollout(args, device, params)
    assert sum(len(p.segment.response_ids) for p in parts) == args.prompts * args.group * args.new_tokens
    results: dict[str, dict[str, float]] = {}
    logps: dict[str, torch.Tensor] = {}
    for kind in args.backends:
        results[kind], logps[kind] = run_backend(kind, args, device, params, parts, fp)
    base_kind = args.backends[0]
    base = results[base_kind]
    for kind, r in results.items():
        d = (logps[kind] - logps[base_kind]).abs()
        r["logp_maxdiff_vs_base"], r["logp_meandiff_vs_base"] = float(d.max()), float(d.mean())
        r["speed_vs_base"] = base["train_s"] / r["train_s"]
        r["mem_vs_base"] = r["peak_mem_gib"] / base["peak_mem_gib"] if base["peak_mem_gib"] else 1.0
    print(
        f"rollout: {rollout_s:.2f} s ({args.decoder}, once); {base['model_tflop']:.1f} TFLOP per train step"
    )
    print(f"{'backend':<9} {'train s':>8} {'range':>13} {'peak GiB':>9} {'tok/s':>8} {'MFU':>6} {'ratio dev':>10} "
          f"{'loss(1)':>10} {'gnorm(1)':>9} {'max|dlogp|':>10} {'speed vs ' + base_kind:>14}")  # fmt: skip
    for kind, r in results.items():
        print(f"{kind:<9} {r['train_s']:8.3f} {r['train_s_min']:6.3f}-{r['train_s_max']:.3f} {r['peak_mem_gib']:9.1f} "
              f"{r['tokens_per_s']:8.0f} {100 * r['mfu']:5.1f}% {r['first_ratio_dev']:10.2e} {r['first_loss']:10.2e} "
              f"{r['first_grad_norm']:9.5f} {r['logp_maxdiff_vs_base']:10.2e} {r['speed_vs_base']:13.2f}x")  # fmt: skip
    if args.json:
        write_json(args.json, args, device, rollout_s=rollout_s, results=results)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
