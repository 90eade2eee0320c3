"""Typed config of the vision-language model: a Qwen2.5-VL checkpoint, or a tiny one built in code."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from unirl.rollout.ar.vlm_bundle import VISION_TOKENS, VLMBundle
from unirl.rollout.ar.vlm_pipeline import VLMPipeline
from unirl.types import ARSamplingParams


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TinyVLMSpec(_Config):
    """Sizes of the in-code tiny Qwen2.5-VL and the corpus its BPE tokenizer is trained on."""

    corpus: list[str] = Field(min_length=1, description="texts the byte-level BPE learns merges from")
    vocab_size: int = Field(default=320, ge=270, description="BPE vocabulary (specials + 256 bytes + merges)")
    image_size: int = Field(default=32, ge=16, description="images are resized to this side (pixels)")
    patch_size: int = Field(default=8, ge=2)
    hidden_size: int = Field(default=64, ge=8)
    num_layers: int = Field(default=2, ge=1)
    num_heads: int = Field(default=4, ge=1)
    num_kv_heads: int = Field(default=2, ge=1)
    intermediate_size: int = Field(default=128, ge=1)
    vision_hidden_size: int = Field(default=64, ge=8)
    vision_depth: int = Field(default=2, ge=1)
    vision_heads: int = Field(default=2, ge=1)
    max_position_embeddings: int = Field(default=128, ge=16, description="context window in tokens")
    seed: int = Field(default=0, ge=0, description="weight-initialisation seed")

    @model_validator(mode="after")
    def _shapes(self) -> TinyVLMSpec:
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise ValueError(
                f"hidden_size={self.hidden_size} / num_heads={self.num_heads} must give a head_dim divisible "
                "by 4 (the rotary frequencies split over time, height and width)"
            )
        if self.image_size % (2 * self.patch_size):
            raise ValueError(
                f"image_size={self.image_size} must be a multiple of 2 * patch_size={2 * self.patch_size} "
                "(patches are merged 2 x 2)"
            )
        return self


class VLMConfig(_Config):
    """A vision-language bundle: a Qwen2.5-VL checkpoint (local dir or hub id) or, with
    ``path=None``, the tiny model of ``tiny``."""

    kind: Literal["vlm"] = "vlm"
    path: str | None = Field(
        default=None, description="local directory or hub id; None builds `tiny` in code"
    )
    tokenizer_path: str | None = None
    family: Literal["qwen2_5_vl"] = "qwen2_5_vl"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    attn_implementation: str | None = None
    freeze_vision: bool = Field(
        default=False,
        description="keep the vision tower fixed: features computed once at rollout, cached on the Part",
    )
    system_prompt: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    tiny: TinyVLMSpec | None = Field(default=None, description="required when path is None")

    @model_validator(mode="after")
    def _source(self) -> VLMConfig:
        if self.path is None and self.tiny is None:
            raise ValueError(
                "model.kind='vlm' needs model.path (a checkpoint) or model.tiny (sizes and corpus)"
            )
        return self

    def build(self) -> VLMBundle:
        if self.path is not None:
            return VLMBundle.from_pretrained(
                self.path, dtype=self.dtype, device=self.device, attn_implementation=self.attn_implementation,
                tokenizer_path=self.tokenizer_path, system_prompt=self.system_prompt,
                chat_template_kwargs=self.chat_template_kwargs, freeze_vision=self.freeze_vision,
                family=self.family,
            )  # fmt: skip
        from unirl.rollout.ar.bpe import train_bpe_tokenizer

        t = self.tiny
        assert t is not None  # the validator guarantees it
        tok = train_bpe_tokenizer(
            t.corpus, family="qwen2", vocab_size=t.vocab_size, extra_special_tokens=VISION_TOKENS
        )
        tok.chat_template = None  # Qwen2-VL's template with image parts
        bundle = VLMBundle.tiny_qwen2_5_vl(
            tok, image_size=t.image_size, patch_size=t.patch_size, hidden_size=t.hidden_size,
            num_layers=t.num_layers, num_heads=t.num_heads, num_kv_heads=t.num_kv_heads,
            intermediate_size=t.intermediate_size, vision_hidden_size=t.vision_hidden_size,
            vision_depth=t.vision_depth, vision_heads=t.vision_heads,
            max_position_embeddings=t.max_position_embeddings, freeze_vision=self.freeze_vision, seed=t.seed,
            dtype=self.dtype, device=self.device,
        )  # fmt: skip
        bundle.system_prompt = self.system_prompt
        bundle.chat_template_kwargs = dict(self.chat_template_kwargs)
        return bundle

    def pipeline(
        self,
        bundle: VLMBundle,
        sampling: ARSamplingParams,
        *,
        stage: str = "ar",
        prompt_template: str = "{prompt}",
        decoder: str = "dynamic",
    ) -> VLMPipeline:
        """The image-conditioned pipeline over ``bundle`` (the dynamic KV-cache decoder only)."""
        if decoder != "dynamic":
            raise ValueError(
                f"rollout.engine.decoder={decoder!r} is not available for model.kind='vlm'; use 'dynamic'"
            )
        return VLMPipeline(bundle, sampling, stage=stage, prompt_template=prompt_template)
