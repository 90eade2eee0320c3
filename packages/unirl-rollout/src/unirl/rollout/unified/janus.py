"""Janus (transformers' ``JanusForConditionalGeneration``): the loading path of a real unified
checkpoint layout, for the text track.

Janus / Janus-Pro is a unified model of the *discrete* kind: one LLM backbone with a text head
(``lm_head``) and an image-generation head (``model.generation_head``) that predicts VQ codebook
tokens autoregressively, decoded by ``model.vqmodel``. Its think step (text) runs on
``UnifiedTextPipeline`` unchanged: ``text_logits`` is the backbone's causal forward over right-padded
text. Its draw step is not a flow-matching velocity, so ``predict_velocity`` raises: the image track
of ``UnifiedImagePipeline`` drives continuous (Transfusion / Bagel / HunyuanImage-3 style) heads;
a VQ-token image track (a second AR head over codebook ids) is not built yet. transformers 5.24
ships no Bagel or HunyuanImage-3 class (HunYuanVL is an understanding-only VLM).

The directory layout is the one ``JanusForConditionalGeneration.save_pretrained`` writes
(``config.json``, ``model.safetensors``, ``generation_config.json``) plus a tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import AutoTokenizer, JanusForConditionalGeneration, PreTrainedTokenizerBase

from unirl.rollout.schedules import DynamicShiftSchedule
from unirl.types import Conditions

__all__ = ["JanusBundle"]


class JanusBundle:
    """A Janus checkpoint as the text half of a ``UnifiedBundle`` (see the module docstring)."""

    embedded_guidance = False

    def __init__(
        self,
        model: JanusForConditionalGeneration,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_text_len: int = 64,
        separator: str = "=",
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_text_len, self.separator = max_text_len, separator
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        if eos is None:
            raise ValueError("the Janus tokenizer has no eos_token; set one before building the bundle")
        self.eos_token_id = int(eos)
        self.pad_token_id = int(pad if pad is not None else eos)
        self.dynamic_schedule = DynamicShiftSchedule(base_grid="scheduler")

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, device: str | torch.device = "cpu", max_text_len: int = 64
    ) -> JanusBundle:
        """Load model (fp32) and tokenizer from a local ``save_pretrained`` directory."""
        model = JanusForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32)
        model = model.to(device)  # type: ignore[arg-type]  # transformers types .to as a wrapper
        return cls(model, AutoTokenizer.from_pretrained(str(path)), max_text_len=max_text_len)

    def save_pretrained(self, directory: str | Path) -> Path:
        d = Path(directory)
        self.model.save_pretrained(d)
        self.tokenizer.save_pretrained(d)
        return d

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # ---- the text head ------------------------------------------------------------------------
    def encode_prompt(self, text: str) -> list[int]:
        return list(self.tokenizer(text + self.separator, add_special_tokens=False)["input_ids"])

    def encode_plan(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def text_logits(self, ids_BL: Tensor, mask_BL: Tensor) -> Tensor:
        out = self.model(input_ids=ids_BL.to(self.device), attention_mask=mask_BL.long().to(self.device))
        return out.logits.float()

    # ---- the image head: discrete (VQ tokens), not a flow-matching velocity --------------------
    def frozen_modules(self) -> dict[str, nn.Module]:
        return {}

    def context_conditions(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> Conditions:
        raise NotImplementedError(_VQ)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        raise NotImplementedError(_VQ)

    def image_seq_len(self, height: int, width: int) -> int:
        return int(self.model.config.vision_config.num_image_tokens)

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        raise NotImplementedError(_VQ)

    def encode_images(self, images_BHWC: Tensor) -> Tensor:
        raise NotImplementedError(_VQ)

    def decode_latents(self, latents: Tensor) -> Tensor:
        raise NotImplementedError(_VQ)


_VQ = (
    "Janus draws with VQ codebook tokens (model.generation_head), not a flow-matching velocity: "
    "UnifiedImagePipeline cannot drive it; a VQ-token image track is not built yet"
)
