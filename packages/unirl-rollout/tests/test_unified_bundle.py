"""The tiny unified model: save/load round trip, the Transfusion attention pattern, and rollout ->
replay parity of both tracks (think: per-token log-probs; draw: per-SDE-step log-probs)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from unirl.rollout.engines.composed import ComposedEngine
from unirl.rollout.engines.trainside import TrainsideEngine
from unirl.rollout.unified import TinyUnifiedBundle, UnifiedBundle, UnifiedImagePipeline, UnifiedTextPipeline
from unirl.rollout.unified.tiny import joint_attention_mask
from unirl.types import ARSamplingParams, DiffusionSamplingParams, Sample, TextPrimitive, to_torch

WORDS = ["a", "two", "red", "blue", "circle", "squares", "draw", "rd", "sq"]


def tiny(seed: int = 0) -> TinyUnifiedBundle:
    b = TinyUnifiedBundle.tiny(WORDS, seed=seed, image_size=16, hidden_size=32, num_layers=2, max_text_len=12)
    with (
        torch.no_grad()
    ):  # the output conv starts at zero; open it so the image head's output is not constant
        b.model.conv_out.weight.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(seed + 1))
    return b


def context(b: TinyUnifiedBundle, prompt: str, plan: str) -> dict[str, torch.Tensor]:
    c = b.context_conditions(b.encode_prompt(prompt), [*b.encode_plan(plan), b.eos_token_id])
    return {k: to_torch(v)[None] for k, v in c.tensors.items()}


def test_save_load_round_trip_is_bit_exact(tmp_path) -> None:
    torch.set_num_threads(1)
    b = tiny()
    assert isinstance(b, UnifiedBundle)
    b.save_pretrained(tmp_path / "ckpt")
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {
        "config.json",
        "model.safetensors",
        "vocab.json",
    }
    c = TinyUnifiedBundle.from_pretrained(tmp_path / "ckpt")
    assert c.model.config == b.model.config and c.vocab.words == b.vocab.words
    sa, sb = b.model.state_dict(), c.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ctx = context(b, "draw two rd sq", "two red squares")
    x, sigma = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0)), torch.tensor([0.6])
    assert torch.equal(b.predict_velocity(x, sigma, ctx), c.predict_velocity(x, sigma, ctx))
    assert torch.equal(
        b.text_logits(ctx["context_ids"], ctx["context_mask"]),
        c.text_logits(ctx["context_ids"], ctx["context_mask"]),
    )
    (tmp_path / "bad").mkdir()
    with pytest.raises(FileNotFoundError, match="needs config.json and model.safetensors"):
        TinyUnifiedBundle.from_pretrained(tmp_path / "bad")


def test_attention_is_causal_over_text_and_bidirectional_within_the_image() -> None:
    """Mask for 3 text tokens (the last is padding) then 2 image tokens, rows = queries:
    text 0 sees {0}; text 1 {0, 1}; pad 2 the valid text and itself (its output is unused); each image token all valid text + both images."""
    m = joint_attention_mask(torch.tensor([[True, True, False]]), 2)[0, 0].int()
    assert m.tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 1, 1],
        [1, 1, 0, 1, 1],
    ]
    torch.set_num_threads(1)
    b = tiny()
    ctx = context(b, "draw two rd sq", "two red squares")
    ids, mask = ctx["context_ids"], ctx["context_mask"]
    logits = b.text_logits(ids, mask)
    later = ids.clone()
    later[0, 7] = 6  # change the token at position 7: logits before it must not move (causal)
    moved = b.text_logits(later, mask)
    assert torch.equal(logits[0, :7], moved[0, :7]) and not torch.equal(logits[0, 7:], moved[0, 7:])
    # the image head reads the plan (the last text tokens) and every image position reads the others
    x, sigma = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0)), torch.tensor([0.6])
    v = b.predict_velocity(x, sigma, ctx)
    other_plan = b.predict_velocity(x, sigma, context(b, "draw two rd sq", "a blue circle"))
    assert (v - other_plan).abs().max() > 1e-4
    x2 = x.clone()
    x2[0, :, 12:, 12:] += 1.0  # the bottom-right corner: beyond any conv's reach of the top-left
    v2 = b.predict_velocity(x2, sigma, ctx)
    assert (v2 - v)[0, :, :2, :2].abs().max() > 1e-6  # only the image tokens' joint attention carries it


def test_think_then_draw_replays_both_tracks_exactly() -> None:
    """Trainside rollout of both tracks, then replay with the same weights: per-token and per-SDE-step
    log-probs reproduce the stored ones exactly (the first-update ratio is 1 in fp32)."""
    torch.set_num_threads(1)
    b = tiny()
    text = UnifiedTextPipeline(b, default_params=ARSamplingParams(max_new_tokens=4, temperature=1.0))
    image = UnifiedImagePipeline(
        b,
        default_params=DiffusionSamplingParams(
            num_steps=3, guidance_scale=1.0, height=16, width=16, shift=1.0
        ),
    )
    engine = ComposedEngine([("ar", TrainsideEngine(text)), ("image", TrainsideEngine(image))])
    prompts = ["draw two rd sq", "a blue circle", "rd sq", "two blue squares"]
    samples = [
        Sample(id=f"s{i}", group_id=f"g{i}", inputs=[TextPrimitive(text=p)]) for i, p in enumerate(prompts)
    ]
    samples = engine.generate(samples, rollout_step=3)
    ars = [s.part("ar") for s in samples]
    assert all(p.segment.response_ids for p in ars)  # type: ignore[union-attr]
    rep = text.replay_logprobs(ars)
    for b_, p in enumerate(ars):
        n = len(p.segment.response_ids)  # type: ignore[union-attr]
        assert rep.mask[b_].sum() == n
        assert torch.equal(rep.logp[b_, :n], to_torch(p.segment.log_probs))  # type: ignore[union-attr]
    imgs = [s.part("image") for s in samples]
    assert all(p.parent == "ar" for p in imgs)
    seg = imgs[0].segment
    for j in seg.sde_indices:  # type: ignore[union-attr]
        got = image.replay_step(imgs, j).log_prob
        want = torch.stack([to_torch(p.segment.log_probs)[p.segment.sde_indices.index(j)] for p in imgs])  # type: ignore[union-attr]
        assert torch.equal(got, want)  # type: ignore[arg-type]
    # the image is conditioned on the exact prompt + plan tokens the text track produced
    s0 = ars[0].segment
    ids = to_torch(imgs[0].conditions.tensors["context_ids"])  # type: ignore[union-attr]
    n = len(s0.prompt_ids) + len(s0.response_ids)  # type: ignore[union-attr]
    assert ids[:n].tolist() == [*s0.prompt_ids, *s0.response_ids]  # type: ignore[union-attr]


def tiny_janus(vocab_size: int) -> Any:
    from transformers import JanusConfig, JanusForConditionalGeneration

    cfg = JanusConfig(
        text_config={"model_type": "llama", "vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 64},
        vision_config={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "image_size": 16,
                       "patch_size": 8, "projection_dim": 32, "num_image_tokens": 4, "depth": 1},
        vq_config={"embed_dim": 8, "num_embeddings": 16, "latent_channels": 32, "base_channels": 32,
                   "channel_multiplier": [1, 1], "num_res_blocks": 1, "projection_dim": 32,
                   "image_token_embed_dim": 32, "num_patches": 2, "num_hidden_layers": 1},
        image_token_id=vocab_size - 1,
    )  # fmt: skip
    torch.manual_seed(0)
    return JanusForConditionalGeneration(cfg).eval()


def test_janus_checkpoint_layout_loads_and_thinks_through_the_text_track(tmp_path) -> None:
    """transformers' Janus (the installed unified-model class): a tiny checkpoint written by
    save_pretrained loads back bit-exact through JanusBundle.from_pretrained, and its text head runs the
    think track (sampling, then a replay that reproduces every token's log-prob). Its image head is
    VQ tokens, which the flow-matching image track refuses with a clear error."""
    from unirl.rollout.ar.tokenizer import build_char_tokenizer
    from unirl.rollout.unified.janus import JanusBundle

    torch.set_num_threads(1)
    tok = build_char_tokenizer("abcdefghijklmnopqrstuvwxyz =", chat_template=None)
    model = tiny_janus(len(tok) + 1)  # one id past the tokenizer: Janus's image placeholder token
    JanusBundle(model, tok).save_pretrained(tmp_path / "janus")
    assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "janus").iterdir()}
    b = JanusBundle.from_pretrained(tmp_path / "janus", max_text_len=32)
    sa, sb = model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ids = torch.tensor([b.encode_prompt("two red squares") + [b.pad_token_id] * 4])
    mask = torch.arange(ids.shape[1])[None] < ids.shape[1] - 4
    assert torch.equal(
        b.text_logits(ids, mask), model(input_ids=ids, attention_mask=mask.long()).logits.float()
    )
    text = UnifiedTextPipeline(b, default_params=ARSamplingParams(max_new_tokens=5, temperature=1.0))
    samples = [
        Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text=p)])
        for i, p in enumerate(["rd sq", "a dot"])
    ]
    parts = [s.part("ar") for s in text.generate(samples, rollout_step=0)]
    rep = text.replay_logprobs(parts)
    for i, p in enumerate(parts):
        n = len(p.segment.response_ids)  # type: ignore[union-attr]
        torch.testing.assert_close(rep.logp[i, :n], to_torch(p.segment.log_probs), rtol=0, atol=1e-6)  # type: ignore[union-attr]
    with pytest.raises(NotImplementedError, match="VQ codebook tokens"):
        b.predict_velocity(torch.zeros(1, 3, 16, 16), torch.tensor([0.5]), {})
