"""The Qwen2.5-VL bundle and pipeline on a tiny config built in code, loaded through the real
loader: image-conditioned decode, replay parity (first-update ratio 1, fp32 CPU) with the vision
features cached (frozen tower) or recomputed (trained tower), and loading errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from unirl.rollout.ar import behavior_logprobs
from unirl.rollout.ar.bpe import train_bpe_tokenizer
from unirl.rollout.ar.vlm_bundle import IMAGE_PAD, VISION_TOKENS, VLMBundle
from unirl.rollout.ar.vlm_pipeline import VLMPipeline
from unirl.types import ARSamplingParams, ImagePrimitive, Sample, TextPrimitive

QUESTIONS = ["how many red circles?", "what colour is the square?", "how many blue squares?"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    tok = train_bpe_tokenizer(
        [*QUESTIONS, "red green blue 0 1 2 3"] * 3,
        family="qwen2",
        vocab_size=300,
        extra_special_tokens=VISION_TOKENS,
    )
    tok.chat_template = None  # the bundle sets Qwen2-VL's template with image parts
    root = tmp_path_factory.mktemp("vlm")
    return VLMBundle.tiny_qwen2_5_vl(tok, image_size=32, patch_size=8, seed=1).save_pretrained(root)


def samples(n: int) -> list[Sample]:
    rng = np.random.default_rng(0)
    return [
        Sample(
            id=f"s{i}", group_id=f"g{i % 2}",
            inputs=[TextPrimitive(text=QUESTIONS[i % 3]), ImagePrimitive(pixels=rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))],
        )
        for i in range(n)
    ]  # fmt: skip


def rollout(bundle: VLMBundle) -> tuple[VLMPipeline, list]:
    pipe = VLMPipeline(bundle, ARSamplingParams(max_new_tokens=8, temperature=0.8, top_k=40))
    return pipe, [s.part("ar") for s in pipe.generate(samples(5), rollout_step=3)]


def test_loads_and_expands_one_pad_per_vision_feature(checkpoint: Path) -> None:
    bundle = VLMBundle.from_pretrained(checkpoint)
    assert type(bundle.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    ids, pixels, grid = bundle.encode_multimodal("how many red circles?", [np.zeros((32, 32, 3), np.uint8)])
    assert grid.tolist() == [[1, 4, 4]]  # 32 px / 8 px patches, one frame
    assert pixels.shape == (16, 3 * 2 * 8 * 8)  # patches x (channels * temporal * patch * patch)
    pad = bundle.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert ids.count(pad) == 4  # 16 patches merged 2x2
    text = bundle.tokenizer.decode(ids)
    assert text == (
        "<|im_start|>user\n<|vision_start|>"
        + IMAGE_PAD * 4
        + "<|vision_end|>how many red circles?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("freeze_vision", [True, False])
def test_first_update_ratio_is_one(checkpoint: Path, freeze_vision: bool) -> None:
    bundle = VLMBundle.from_pretrained(checkpoint, freeze_vision=freeze_vision)
    pipe, parts = rollout(bundle)
    cached = {k for k in parts[0].conditions.tensors}
    assert cached == (
        {"image_grid_thw", "image_embeds"} if freeze_vision else {"image_grid_thw", "pixel_values"}
    )
    replay = pipe.replay_logprobs(parts)
    old_logprobs = behavior_logprobs(parts)
    ratio = torch.exp(replay.logp - old_logprobs)[replay.mask]
    assert ratio.numel() == sum(len(p.segment.response_ids) for p in parts) > 5
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0), (ratio - 1).abs().max()
    # gradients reach the vision tower only when it trains
    replay.logp[replay.mask].sum().backward()
    vis_grads = [p.grad for p in bundle.visual.parameters()]
    assert (
        all(g is None for g in vis_grads)
        if freeze_vision
        else any(g is not None and g.abs().sum() > 0 for g in vis_grads)
    )


def test_the_image_conditions_the_answer(checkpoint: Path) -> None:
    bundle = VLMBundle.from_pretrained(checkpoint, freeze_vision=True)
    pipe, parts = rollout(bundle)
    swapped = [p.model_copy(deep=True) for p in parts[:2]]
    swapped[0].conditions, swapped[1].conditions = parts[1].conditions, parts[0].conditions
    swapped[0].segment.prompt_ids, swapped[1].segment.prompt_ids = (
        parts[1].segment.prompt_ids,
        parts[0].segment.prompt_ids,
    )
    with torch.no_grad():
        a = pipe.replay_logprobs(parts[:2]).logp
        b = pipe.replay_logprobs(swapped).logp
    assert not torch.allclose(a, b, atol=1e-4)
    with torch.no_grad():  # one row alone replays as in the batch
        one = pipe.replay_logprobs(parts[1:2]).logp
    n = len(parts[1].segment.response_ids)
    assert torch.allclose(one[0, :n], a[1, :n], atol=1e-5)


def test_vlm_errors(checkpoint: Path, tmp_path: Path) -> None:
    bundle = VLMBundle.from_pretrained(checkpoint)
    pipe = VLMPipeline(bundle, ARSamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="has no image input"):
        pipe.generate([Sample(id="t", group_id="g", inputs=[TextPrimitive(text="hi")])], rollout_step=0)
    with pytest.raises(ValueError, match="model.family='qwen3' expects 'qwen3'"):
        VLMBundle.from_pretrained(checkpoint, family="qwen3")
    bundle.model.save_pretrained(tmp_path)
    bundle.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no preprocessor_config.json"):
        VLMBundle.from_pretrained(tmp_path)
