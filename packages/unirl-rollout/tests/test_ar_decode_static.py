"""The static-shape decoder (the CUDA-graph path's step, run eagerly here) draws exactly what the
dynamic decoder draws: same tokens, same log-probs, same stop handling, for SDPA and eager
attention, with and without top-k / top-p, whatever the prompt-block padding."""

from __future__ import annotations

import pytest
import torch

from unirl.rollout.ar import ARPipeline, CausalLMBundle
from unirl.rollout.ar.decode import decode
from unirl.rollout.ar.decode_static import decode_static
from unirl.types import ARSamplingParams, Sample, TextPrimitive

PROMPTS = [[5, 6, 7, 8, 9], [4, 3], [9, 9, 9, 1, 2, 3, 4], [11]]


@pytest.fixture(scope="module")
def bundle() -> CausalLMBundle:
    return CausalLMBundle.tiny_qwen3(seed=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (5, 0.8)])
@pytest.mark.parametrize("pad_to", [1, 16])
def test_static_decoder_matches_dynamic(bundle, attn: str, top_k: int, top_p: float, pad_to: int) -> None:
    model = bundle.model.eval()
    model.config._attn_implementation = attn
    try:
        u = torch.rand(len(PROMPTS), 14, generator=torch.Generator().manual_seed(3))
        kw = dict(
            uniforms_BN=u, limits=[14, 6, 14, 9], temperature=0.9, top_k=top_k, top_p=top_p,
            stop_token_ids=[], pad_token_id=bundle.pad_token_id, sync_every=4,
        )  # fmt: skip
        kw["stop_token_ids"] = [int(decode(model, PROMPTS, **kw).tokens[0, 3])]  # row 0 stops at step 3
        ref = decode(model, PROMPTS, **kw)
        got = decode_static(model, PROMPTS, pad_prompt_to=pad_to, graph=False, kv_bucket=4, **kw)
    finally:
        model.config._attn_implementation = "sdpa"
    assert torch.equal(got.tokens, ref.tokens)
    assert torch.equal(got.lengths, ref.lengths) and torch.equal(got.stopped, ref.stopped)
    torch.testing.assert_close(got.logprobs, ref.logprobs, atol=1e-5, rtol=0)
    assert bool(ref.stopped[0]) and int(ref.lengths[0]) <= 4 and int(ref.lengths[1]) <= 6


def test_pipeline_decoders_give_identical_samples(bundle) -> None:
    params = ARSamplingParams(max_new_tokens=10, temperature=1.0, seed=4)

    def run(decoder: str) -> list[tuple[list[int], list[float]]]:
        pipe = ARPipeline(bundle, params, decoder=decoder)  # type: ignore[arg-type]
        samples = [
            Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text=t)])
            for i, t in enumerate(["1+1=", "23+19=", "7="])
        ]
        out = pipe.generate(samples, rollout_step=2)
        return [(s.part("ar").segment.response_ids, s.part("ar").segment.log_probs.tolist()) for s in out]

    dyn, sta = run("dynamic"), run("static")
    assert [r for r, _ in dyn] == [r for r, _ in sta]
    for (_, a), (_, b) in zip(dyn, sta):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5


def test_static_decoder_refuses_lockstep_and_sliding_models(bundle) -> None:
    with pytest.raises(ValueError, match="lockstep"):
        ARPipeline(bundle, ARSamplingParams(max_new_tokens=4), decoder="graph", lockstep_group="world")
    cfg = bundle.model.config
    saved = cfg.layer_types
    cfg.layer_types = ["sliding_attention"] * len(saved)
    try:
        with pytest.raises(NotImplementedError, match="full-attention"):
            decode_static(
                bundle.model, [[1, 2]], uniforms_BN=torch.rand(1, 3), limits=[3], temperature=1.0,
                top_k=0, top_p=1.0, stop_token_ids=[], pad_token_id=bundle.pad_token_id,
            )  # fmt: skip
    finally:
        cfg.layer_types = saved
