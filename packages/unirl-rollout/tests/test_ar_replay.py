"""Teacher-forced replay: first-update ratio 1, micro-batch invariance, gradients, masks."""

from __future__ import annotations

import pytest
import torch

from unirl.rollout.ar import ARPipeline, CausalLMBundle, behavior_logprobs, build_char_tokenizer, loss_mask
from unirl.types import ARSamplingParams, LatentTrajectory, Part, Sample, TextPrimitive, TextSegment

PROMPTS = ["1+2=", "a longer prompt with more tokens", "33*3=", "?", "5-9=", "hello"]


@pytest.fixture(scope="module")
def bundle() -> CausalLMBundle:
    torch.set_num_threads(1)
    return CausalLMBundle.tiny_qwen3(seed=2)


def rollout(bundle: CausalLMBundle, **params: object) -> tuple[ARPipeline, list[Part]]:
    kw: dict[str, object] = {"max_new_tokens": 20, "temperature": 0.7, "top_k": 8, "top_p": 0.9, **params}
    pipe = ARPipeline(bundle, ARSamplingParams(**kw), sync_every=3)  # type: ignore[arg-type]
    samples = [
        Sample(id=f"r{i}", group_id="g", inputs=[TextPrimitive(text=t)]) for i, t in enumerate(PROMPTS)
    ]
    return pipe, [s.part("ar") for s in pipe.generate(samples, rollout_step=1)]


def mixed_length_rollout(bundle: CausalLMBundle) -> tuple[ARPipeline, list[Part]]:
    """A rollout where some rows stop mid-batch (on a token common in the free run) and some hit length."""
    _, free = rollout(bundle)
    counts = torch.bincount(torch.tensor([t for p in free for t in p.segment.response_ids[1:]]))
    stop_tok = int(counts.argmax())
    pipe, parts = rollout(bundle, stop_token_ids=[stop_tok])
    lengths = [len(p.segment.response_ids) for p in parts]
    reasons = {p.segment.finish_reason for p in parts}
    assert reasons == {"stop", "length"} and len(set(lengths)) >= 3, (lengths, reasons)
    return pipe, parts


def test_first_update_ratio_is_one(bundle: CausalLMBundle) -> None:
    pipe, parts = mixed_length_rollout(bundle)
    replay = pipe.replay_logprobs(parts)
    old_logprobs = behavior_logprobs(parts)
    assert replay.logp.shape == old_logprobs.shape == replay.mask.shape
    assert replay.mask.sum().item() == sum(len(p.segment.response_ids) for p in parts)
    ratio = torch.exp(replay.logp - old_logprobs)[replay.mask]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0), (ratio - 1).abs().max()
    assert (replay.logp[~replay.mask] == 0).all()


def test_micro_batch_one_vs_four_same_logp(bundle: CausalLMBundle) -> None:
    pipe, parts = mixed_length_rollout(bundle)
    parts = parts[:4]
    with torch.no_grad():
        full = pipe.replay_logprobs(parts)
        for b, p in enumerate(parts):
            one = pipe.replay_logprobs([p])
            n = len(p.segment.response_ids)
            assert one.logp.shape == (1, n)
            assert torch.allclose(one.logp[0], full.logp[b, :n], atol=1e-5, rtol=0)


def test_replay_matches_unpadded_reference(bundle: CausalLMBundle) -> None:
    # independent reference: one unpadded forward over prompt + response, log_softmax(logits / T)
    prompt, resp, T = bundle.encode_prompt("7+7="), [10, 20, 30, 2], 0.5
    part = Part(
        name="ar",
        segment=TextSegment(prompt_ids=prompt, response_ids=resp),
        sampling_params=ARSamplingParams(max_new_tokens=4, temperature=T),
    )
    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=4))
    with torch.no_grad():
        got = pipe.replay_logprobs([part]).logp[0]
        logits = bundle.model(input_ids=torch.tensor([prompt + resp])).logits[0].float()
    ref = torch.log_softmax(logits / T, -1)[len(prompt) - 1 : -1].gather(-1, torch.tensor(resp)[:, None])[
        :, 0
    ]
    assert torch.allclose(got, ref, atol=1e-5, rtol=0)


def test_replay_uses_the_recorded_temperature(bundle: CausalLMBundle) -> None:
    pipe, parts = rollout(bundle, temperature=0.7)
    hot = [
        p.model_copy(update={"sampling_params": p.sampling_params.model_copy(update={"temperature": 1.3})})
        for p in parts
    ]
    with torch.no_grad():
        a, b = pipe.replay_logprobs(parts), pipe.replay_logprobs(hot)
    assert torch.allclose(a.logp[a.mask], behavior_logprobs(parts)[a.mask], atol=1e-5, rtol=0)
    assert (a.logp - b.logp)[a.mask].abs().max() > 1e-2


def _grads(bundle: CausalLMBundle) -> list[torch.Tensor]:
    out = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in bundle.model.parameters()]
    bundle.model.zero_grad()
    return out


def test_replay_gradients_do_not_leak_through_padding(bundle: CausalLMBundle) -> None:
    pipe, parts = mixed_length_rollout(bundle)
    short = min(range(len(parts)), key=lambda i: len(parts[i].segment.response_ids))
    bundle.model.zero_grad()
    replay = pipe.replay_logprobs(parts)
    assert replay.logp.requires_grad
    # gradient of the shortest part's summed log-prob: alone vs inside the padded batch
    replay.logp[short].sum().backward()
    batched = _grads(bundle)
    pipe.replay_logprobs([parts[short]]).logp[0].sum().backward()
    alone = _grads(bundle)
    assert sum(float(g.abs().sum()) for g in alone) > 0
    for g_b, g_a in zip(batched, alone):
        assert torch.allclose(g_b, g_a, atol=1e-5, rtol=1e-4)


def test_loss_mask_is_respected_and_padded(bundle: CausalLMBundle) -> None:
    pipe, parts = rollout(bundle, max_new_tokens=6)
    seg = parts[0].segment
    masked = parts[0].model_copy(
        update={
            "segment": seg.model_copy(
                update={"loss_mask": torch.tensor([False, True] + [True] * (len(seg.response_ids) - 2))}
            )
        }
    )
    m = loss_mask([masked, parts[1]])
    assert m[0].tolist()[:2] == [False, True]
    replay = pipe.replay_logprobs([masked, parts[1]])
    assert torch.equal(replay.mask, m)


def test_replay_rejects_non_text_parts(bundle: CausalLMBundle) -> None:
    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=4))
    with pytest.raises(TypeError, match=r"part 'ar' has segment kind None"):
        pipe.replay_logprobs([Part(name="ar")])
    latent = LatentTrajectory(
        latents=torch.zeros(2, 1, 2), positions=[0, 1], sigmas=[1.0, 0.0], sde_indices=[0]
    )
    with pytest.raises(TypeError, match=r"segment kind 'latent'"):
        pipe.replay_logprobs([Part(name="diffusion", segment=latent)])
    with pytest.raises(ValueError, match="no stored log_probs"):
        behavior_logprobs([Part(name="sft", segment=TextSegment(prompt_ids=[1], response_ids=[2]))])


def test_any_causal_lm_absolute_positions_gpt2() -> None:
    # GPT-2 has learned absolute position embeddings, so unlike RoPE (shift-invariant) it fails
    # unless sampling and replay both count positions over real tokens only.
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=96,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=3,
    )
    gpt2 = CausalLMBundle(GPT2LMHeadModel(cfg).eval(), tok)
    assert gpt2.context_window == 96
    pipe, parts = rollout(gpt2)
    with torch.no_grad():
        replay = pipe.replay_logprobs(parts)
        one = pipe.replay_logprobs(parts[1:2])
    ratio = torch.exp(replay.logp - behavior_logprobs(parts))[replay.mask]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)
    n = len(parts[1].segment.response_ids)
    assert torch.allclose(one.logp[0], replay.logp[1, :n], atol=1e-5, rtol=0)
