"""Autoregressive (causal LM) rollout: bundle, KV-cached sampler, teacher-forced replay.

Log-probs are of the temperature-scaled, unfiltered distribution (see ``sampling``).
"""

from unirl.rollout.ar.bundle import CausalLMBundle
from unirl.rollout.ar.config import ARPipelineConfig, CausalLMConfig, TinyQwen3Spec
from unirl.rollout.ar.partial import PartialRollouts, WeightSwap, decode_partial
from unirl.rollout.ar.pipeline import ARPipeline
from unirl.rollout.ar.replay import TokenReplay, replay_token_logprobs
from unirl.rollout.ar.sampling import derive_seed
from unirl.rollout.ar.segments import behavior_logprobs, loss_mask, text_segment
from unirl.rollout.ar.tokenizer import build_char_tokenizer

__all__ = [
    "ARPipeline",
    "ARPipelineConfig",
    "CausalLMBundle",
    "CausalLMConfig",
    "PartialRollouts",
    "TinyQwen3Spec",
    "TokenReplay",
    "WeightSwap",
    "behavior_logprobs",
    "build_char_tokenizer",
    "decode_partial",
    "derive_seed",
    "loss_mask",
    "replay_token_logprobs",
    "text_segment",
]
