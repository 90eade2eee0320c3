"""Real-architecture-size AR families on one GPU (random init, bf16; device machine only).

A Qwen3-0.6B-shaped causal LM and a Qwen2.5-VL-3B-shaped VLM, built from their configs with
random weights (no hub), each through ``save_pretrained`` -> the bundle's ``from_pretrained``:
shape / dtype checks, then one 16-sample RL step (rollout, then replay + a GRPO-style surrogate
backward + AdamW step) timed, with the peak memory. Each test prints one ``ROW`` line for the docs
table (docs/benchmarks.md, "AR families on the H200")::

    .venv/bin/python -m pytest packages/unirl-rollout/tests/test_ar_families_gpu.py -q -s -m gpu
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from unirl.rollout.ar import ARPipeline, CausalLMBundle, behavior_logprobs
from unirl.rollout.ar.bpe import family_eos_ids, train_bpe_tokenizer
from unirl.rollout.ar.vlm_bundle import VISION_TOKENS, VLMBundle
from unirl.rollout.ar.vlm_pipeline import VLMPipeline
from unirl.types import ARSamplingParams, ImagePrimitive, Sample, TextPrimitive

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CORPUS = [
    "What is 12 plus 7? The answer is 19.",
    "how many red circles? what colour is the square? red 2",
] * 8
N_SAMPLES, NEW_TOKENS = 16, 128


def _train_step(pipe: object, parts: list) -> float:
    """Replay with gradients, the GRPO surrogate with unit advantages, backward, AdamW: seconds."""
    model = pipe.model  # type: ignore[attr-defined]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    torch.cuda.synchronize()
    t0 = time.time()
    replay = pipe.replay_logprobs(parts)  # type: ignore[attr-defined]
    old_logprobs = behavior_logprobs(parts).cuda()
    adv = torch.linspace(-1, 1, len(parts), device="cuda")[:, None]
    ratio = torch.exp(replay.logp - old_logprobs)
    loss = -(ratio * adv)[replay.mask].mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return time.time() - t0


def _row(name: str, model: torch.nn.Module, rollout_s: float, train_s: float, parts: list) -> None:
    row = {
        "family": name,
        "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "peak_mem_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "rollout_s": round(rollout_s, 2),
        "train_s": round(train_s, 2),
        "tokens": sum(len(p.segment.response_ids) for p in parts),
    }
    print("ROW", json.dumps(row))


def test_qwen3_0_6b_shaped_rollout_and_train_step(tmp_path: Path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = train_bpe_tokenizer(CORPUS, family="qwen3", vocab_size=400)
    cfg = Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config.eos_token_id = family_eos_ids(tok, "qwen3")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    bundle = CausalLMBundle.from_pretrained(tmp_path, family="qwen3", dtype="bfloat16", device="cuda")
    assert next(bundle.model.parameters()).dtype == torch.bfloat16
    assert 590e6 < sum(p.numel() for p in bundle.model.parameters()) < 610e6  # 0.6B, tied embeddings
    torch.cuda.reset_peak_memory_stats()
    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0))
    samples = [
        Sample(id=f"s{i}", group_id=f"g{i // 4}", inputs=[TextPrimitive(text=CORPUS[i % 2])])
        for i in range(N_SAMPLES)
    ]
    torch.cuda.synchronize()
    t0 = time.time()
    parts = [s.part("ar") for s in pipe.generate(samples, rollout_step=0)]
    torch.cuda.synchronize()
    rollout_s = time.time() - t0
    with torch.no_grad():
        d = pipe.replay_logprobs(parts).logp.cpu() - behavior_logprobs(parts)
    assert d.abs().mean() < 5e-2  # bf16: close, not exact
    _row("Qwen3-0.6B (random init)", bundle.model, rollout_s, _train_step(pipe, parts), parts)


def test_qwen2_5_vl_3b_shaped_rollout_and_train_step(tmp_path: Path) -> None:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from unirl.rollout.ar.vlm_bundle import VLM_CHAT_TEMPLATE

    tok = train_bpe_tokenizer(CORPUS, family="qwen2", vocab_size=400, extra_special_tokens=VISION_TOKENS)
    tok.chat_template = VLM_CHAT_TEMPLATE
    ids = tok.convert_tokens_to_ids
    cfg = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
            num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1e6},
        ),
        vision_config=dict(
            depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14, spatial_merge_size=2,
            temporal_patch_size=2, out_hidden_size=2048, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
        ),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    side = 448  # 32 x 32 patches of 14 px: 256 image tokens
    Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side).save_pretrained(tmp_path)
    bundle = VLMBundle.from_pretrained(tmp_path, dtype="bfloat16", device="cuda")
    assert next(bundle.model.parameters()).dtype == torch.bfloat16
    assert 3.0e9 < sum(p.numel() for p in bundle.model.parameters()) < 4.2e9  # 3B-class
    rng = np.random.default_rng(0)
    samples = [
        Sample(
            id=f"v{i}", group_id=f"g{i // 4}",
            inputs=[TextPrimitive(text="how many red circles?"), ImagePrimitive(pixels=rng.integers(0, 256, (side, side, 3), dtype=np.uint8))],
        )
        for i in range(N_SAMPLES)
    ]  # fmt: skip
    torch.cuda.reset_peak_memory_stats()
    pipe = VLMPipeline(bundle, ARSamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0))
    torch.cuda.synchronize()
    t0 = time.time()
    parts = [s.part("ar") for s in pipe.generate(samples, rollout_step=0)]
    torch.cuda.synchronize()
    rollout_s = time.time() - t0
    assert parts[0].segment.prompt_ids.count(ids("<|image_pad|>")) == 256
    _row("Qwen2.5-VL-3B (random init, 448 px)", bundle.model, rollout_s, _train_step(pipe, parts), parts)
