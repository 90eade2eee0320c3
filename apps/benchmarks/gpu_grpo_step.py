"""One GRPO step on a Qwen3-0.6B-architecture causal LM (random init), trainside, on one GPU.

Issue 8's benchmark: 8 prompts x 8 samples of 64 prompt tokens, exactly 512 new tokens each (EOS
masked), temperature 1; then one full fine-tune AdamW step over the 64 completions with
micro-batch 16 (bf16 compute through FSDP2's mixed precision, fp32 master weights). Rewards are
seeded random numbers (the model is random): the step's work does not depend on their values.

The rollout uses the training module itself (``TrainsideEngine``), gathered once per rollout
(``FSDPBackend.gathered``). ``--decoders`` runs the same step with each decode loop and prints a
table with ratios against the first one listed; every step after the first ``--warmup`` is timed.

    python apps/benchmarks/gpu_grpo_step.py --decoders dynamic graph --json out.json
    python apps/benchmarks/gpu_grpo_step.py --tiny   # CPU smoke run (tests/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Iterator

import numpy as np
import torch

from unirl.rollout.ar import ARPipeline, CausalLMBundle
from unirl.rollout.engines import TrainsideEngine
from unirl.train.algorithms import GRPOConfig
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.optim import AdamWConfig
from unirl.train.precision import PrecisionConfig
from unirl.train.stack import TrainStack
from unirl.train.step_gc import manual_gc
from unirl.types import ARSamplingParams, Sample, TextPrimitive, compute_advantages

QWEN3_0_6B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
    max_position_embeddings=40960, rope_theta=1_000_000.0,
)  # fmt: skip
TINY = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, max_position_embeddings=512,
)  # fmt: skip


def make_model(tiny: bool, device: torch.device, compile_layers: str = "") -> CausalLMBundle:
    """The random-init model (seed 0: the same weights on every call) and the tiny tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = CausalLMBundle.tiny_qwen3().tokenizer
    cfg = Qwen3Config(**(TINY if tiny else QWEN3_0_6B), pad_token_id=0, eos_token_id=2)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    if compile_layers == "layers":  # each whole decoder layer (training and prefill run them)
        for layer in model.model.layers:
            layer.compile()
    elif compile_layers:  # regional compilation of the cache-free parts: MLPs and RMSNorms
        for layer in model.model.layers:
            for mod in (layer.mlp, layer.input_layernorm, layer.post_attention_layernorm):
                mod.compile()
            layer.self_attn.q_norm.compile()
            layer.self_attn.k_norm.compile()
        model.model.norm.compile()
    return CausalLMBundle(model, tok)


def make_backend(kind: str, model: torch.nn.Module, device: torch.device, reshard: bool = False) -> object:
    """Issue 8's optimizer (AdamW lr 1e-6, grad clip 1) on ``kind``: fsdp (FSDP2), megatron
    (megatron-core GPTModel, SDPA core attention; ``model`` stays its rollout copy) or
    megatron-unfused (megatron-core's own unfused attention); bf16 compute on CUDA for all."""
    opt, precision = AdamWConfig(lr=1e-6), PrecisionConfig()
    if kind == "fsdp":
        return FSDPConfig(
            optimizer=opt, grad_clip=1.0, precision=precision, reshard_after_forward=reshard
        ).build(model, device)
    if kind in ("megatron", "megatron-unfused"):
        from unirl.train.backends.megatron import MegatronConfig

        attention = "unfused" if kind == "megatron-unfused" else "sdpa"
        cfg = MegatronConfig(optimizer=opt, grad_clip=1.0, precision=precision, attention=attention)
        return cfg.build(model, device)
    raise ValueError(f"unknown backend {kind!r}: fsdp, megatron or megatron-unfused")


def build(
    tiny: bool, device: torch.device, compile_layers: str = "", reshard: bool = False, backend: str = "fsdp"
) -> tuple[CausalLMBundle, object]:
    bundle = make_model(tiny, device, compile_layers)
    return bundle, make_backend(backend, bundle.model, device, reshard)


def prompt_of(bundle: CausalLMBundle, n_tokens: int, salt: int) -> str:
    """A prompt text that encodes to exactly ``n_tokens`` tokens."""
    text = f"{salt}+"
    while len(bundle.encode_prompt(text)) < n_tokens:
        text += str((len(text) * 7 + salt) % 10)
    if len(bundle.encode_prompt(text)) != n_tokens:
        raise RuntimeError(f"could not build a {n_tokens}-token prompt with this tokenizer")
    return text


def make_samples(args: argparse.Namespace, bundle: CausalLMBundle) -> list[Sample]:
    """``args.prompts`` groups of ``args.group`` samples, each prompt ``args.prompt_tokens`` long."""
    return [
        Sample(
            id=f"p{p}-{i}",
            group_id=f"p{p}",
            inputs=[TextPrimitive(text=prompt_of(bundle, args.prompt_tokens, p))],
        )
        for p in range(args.prompts)
        for i in range(args.group)
    ]


def random_advantages(samples: list[Sample], seed: int) -> list:
    """The samples' ``ar`` Parts with group advantages of seeded random rewards."""
    parts = [s.part("ar") for s in samples]
    rewards = np.random.default_rng(seed).random(len(parts))
    for p, a in zip(parts, compute_advantages(rewards, [s.group_id for s in samples])):
        p.advantage = float(a)
    return parts


H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s (datasheet; H100 SXM the same)


def model_flops(model: torch.nn.Module, n_seq: int, prompt: int, new: int) -> float:
    """Forward + backward FLOPs of one train step over ``n_seq`` sequences (6 x weights x tokens for
    the layers and the LM head over the response positions, plus causal attention)."""
    cfg = model.config
    n_layers = sum(p.numel() for p in model.model.layers.parameters()) + model.model.norm.weight.numel()
    S, T = prompt + new, new
    dense = 6 * n_layers * n_seq * S + 6 * cfg.vocab_size * cfg.hidden_size * n_seq * (T + 1)
    attn = 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * n_seq * S**2
    return float(dense + attn)


# Wall time of each decode loop call (the rest of gen_s: prompts, prefill setup, texts).
DECODE_S: list[float] = []


def _timed_decoder() -> None:
    import unirl.rollout.ar.pipeline as pipeline_mod

    inner = pipeline_mod.decode_static

    def timed(*a, **kw):  # type: ignore[no-untyped-def]
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        t = time.perf_counter()
        out = inner(*a, **kw)
        sync()
        DECODE_S.append(time.perf_counter() - t)
        return out

    pipeline_mod.decode_static = timed  # type: ignore[assignment]


def one_step(args, bundle, backend, pipe, engine, step: int, prof=contextlib.nullcontext) -> dict[str, float]:
    """One timed GRPO step; ``prof()`` wraps the rollout and, separately, the train step."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    samples = make_samples(args, bundle)
    sync()
    DECODE_S.clear()
    t0 = time.perf_counter()
    with backend.gathered(), prof("rollout"):
        samples = engine.generate(samples, rollout_step=step)
    sync()
    t1 = time.perf_counter()
    parts = random_advantages(samples, seed=step)
    stack = TrainStack(backend, GRPOConfig().build(), pipe, BatchGeometry(micro_batch_size=args.micro))
    with prof("train"):
        metrics = stack.train_on(parts)
    sync()
    t2 = time.perf_counter()
    tokens = sum(len(p.segment.response_ids) for p in parts)
    flops = model_flops(bundle.model, len(parts), args.prompt_tokens, args.new_tokens)
    return {
        "gen_s": t1 - t0,
        "decode_s": sum(DECODE_S),
        "train_s": t2 - t1,
        "step_s": t2 - t0,
        "tokens": tokens,
        "tokens_per_s": tokens / (t1 - t0),
        "train_mfu": flops / (t2 - t1) / H200_BF16_PEAK,
        "ratio_dev": max(abs(metrics["ratio_max"] - 1), abs(1 - metrics["ratio_min"])),
        "optimizer_steps": metrics["num_optimizer_steps"],
    }


@contextlib.contextmanager
def profiled(name: str) -> Iterator[None]:
    """Print the top CUDA kernels of the wrapped region."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        yield
    print(f"== {name}: top CUDA kernels")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


def write_json(path: str, args: argparse.Namespace, device: torch.device, **fields: object) -> None:
    """The run's arguments, device name and `fields` as JSON at `path`."""
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    with open(path, "w") as f:
        json.dump({"args": vars(args), "device": name, **fields}, f, indent=2)


def add_step_args(ap: argparse.ArgumentParser) -> None:
    """Issue 8's step sizes (``--tiny`` shrinks them: `apply_tiny`)."""
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--tiny", action="store_true", help="tiny model and sizes (CPU smoke run)")


def apply_tiny(args: argparse.Namespace) -> None:
    if args.tiny:
        args.prompts, args.group, args.prompt_tokens, args.new_tokens, args.micro = 2, 2, 24, 6, 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--decoders",
        nargs="+",
        default=["graph"],
        help="dynamic | static | graph | compiled | fused, optionally :KV_BUCKET (e.g. graph:128; graph = graph:0, one graph)",
    )
    add_step_args(ap)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per decoder")
    ap.add_argument(
        "--compile", nargs="?", const="regional", default="",
        help="compile the model's modules: regional (the MLPs and RMSNorms; the default) or layers (each decoder layer)",
    )  # fmt: skip
    ap.add_argument(
        "--profile",
        action="store_true",
        help="profile one more step of the last decoder: top CUDA kernels of its rollout and train step",
    )
    ap.add_argument(
        "--reshard", action="store_true", help="FSDP reshard_after_forward (re-gather for backward)"
    )
    ap.add_argument(
        "--auto-gc", action="store_true",
        help="CPython's automatic cyclic GC inside the steps (the recipes' manual_gc=false); default: "
        "collected between steps, as the trainers do (unirl.train.step_gc)",
    )  # fmt: skip
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    apply_tiny(args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    _timed_decoder()
    bundle, backend = build(args.tiny, device, args.compile, args.reshard)
    params = ARSamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, stop_token_ids=[], seed=0)
    results: dict[str, dict[str, float]] = {}
    for dec in args.decoders:
        kind, _, bucket = dec.partition(":")
        pipe = ARPipeline(bundle, params, stop_at_eos=False, decoder=kind, kv_bucket=int(bucket or 0))  # type: ignore[arg-type]
        engine = TrainsideEngine(pipe, weight_version=lambda: backend.global_step)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        runs = []
        with manual_gc(not args.auto_gc) as collect:
            for k in range(args.warmup + args.steps):
                collect()
                runs.append(one_step(args, bundle, backend, pipe, engine, k))
        timed = runs[args.warmup :]
        res = {k: statistics.median(r[k] for r in timed) for k in timed[0]}
        res["ratio_dev"] = max(r["ratio_dev"] for r in runs)
        res["step_s_min"], res["step_s_max"] = (
            min(r["step_s"] for r in timed),
            max(r["step_s"] for r in timed),
        )
        res["first_gen_s"] = runs[0]["gen_s"]  # includes one-off costs (compile, graph capture)
        res["steps"] = [{k: r[k] for k in ("gen_s", "decode_s", "train_s", "step_s")} for r in timed]
        for k, r in enumerate(timed):  # each timed step's phases: where a slow step spends its time
            print(
                f"{dec} step {k}: gen {r['gen_s']:.3f} s (decode {r['decode_s']:.3f}), train {r['train_s']:.3f} s"
            )
        res["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
        results[dec] = res
        assert res["tokens"] == args.prompts * args.group * args.new_tokens, res
    if args.profile:  # one more step of the last decoder, its rollout and train step profiled
        one_step(args, bundle, backend, pipe, engine, args.warmup + args.steps, prof=profiled)
    base = results[args.decoders[0]]
    print(f"{'decoder':<8} {'gen s':>7} {'decode s':>8} {'train s':>8} {'step s':>7} {'tok/s':>9} {'peak GiB':>9} "
          f"{'step range':>13} {'ratio dev':>10} {'train MFU':>9} {'step vs ' + args.decoders[0]:>14}")  # fmt: skip
    for dec, r in results.items():
        print(f"{dec:<8} {r['gen_s']:7.3f} {r['decode_s']:8.3f} {r['train_s']:8.3f} {r['step_s']:7.3f} {r['tokens_per_s']:9.0f} "
              f"{r['peak_mem_gib']:9.1f} {r['step_s_min']:6.3f}-{r['step_s_max']:.3f} {r['ratio_dev']:10.2e} "
              f"{100 * r['train_mfu']:8.1f}% "
              f"{base['step_s'] / r['step_s']:13.2f}x")  # fmt: skip
    if args.json:
        write_json(args.json, args, device, results=results)


if __name__ == "__main__":
    main()
