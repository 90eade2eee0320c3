"""The autoregressive recipe: every field typed, validated before any compute."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from unirl.apps.data import PromptListConfig
from unirl.apps.trainers.components import Policy
from unirl.apps.trainers.phases import RLPhase, RunSettings, SFTPhaseBase
from unirl.apps.worlds.arithmetic_source import ArithmeticDataConfig
from unirl.apps.worlds.shapes_vqa import ShapesVQAConfig
from unirl.apps.worlds.word_problems_source import WordProblemsDataConfig
from unirl.reward.config import ServiceConfig
from unirl.rollout.ar import ARPipeline, CausalLMBundle
from unirl.rollout.ar.config import CausalLMConfig
from unirl.rollout.ar.vlm_config import VLMConfig
from unirl.rollout.ar.vlm_pipeline import VLMPipeline
from unirl.rollout.engines.vllm_config import VLLMEngineConfig
from unirl.train.algorithms import TokenSFTConfig
from unirl.train.backends.config import BackendConfig
from unirl.types import ARSamplingParams
from unirl.types.base import kind_or

DataConfig = Annotated[
    PromptListConfig | ArithmeticDataConfig | WordProblemsDataConfig | ShapesVQAConfig,
    Field(discriminator="kind"),
]


ModelConfig = Annotated[
    Annotated[CausalLMConfig, Tag("causal_lm")] | Annotated[VLMConfig, Tag("vlm")],
    Discriminator(kind_or("causal_lm")),
]


class TrainsideEngineConfig(BaseModel):
    """Sample with the training module itself (no weight sync)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["trainside"] = "trainside"
    decoder: Literal["dynamic", "static", "graph", "compiled", "fused"] = Field(
        default="dynamic",
        description="decode loop: dynamic (growing KV cache, any model), static (fixed-shape step), "
        "graph (static, each token step replayed as a CUDA graph), compiled (graph with the step "
        "through torch.compile, after a one-off compile) or fused (compiled, with concatenated "
        "projections; Llama-family models without LoRA: the fastest on a GPU). All draw the same "
        "tokens; the static ones sample with the weights gathered once per rollout",
    )


EngineConfig = Annotated[
    Annotated[TrainsideEngineConfig, Tag("trainside")] | Annotated[VLLMEngineConfig, Tag("vllm")],
    Discriminator(kind_or("trainside")),
]


class ARRolloutConfig(BaseModel):
    """Who samples the RL rollouts and evaluations: ``engine.kind`` trainside | vllm."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    engine: EngineConfig = Field(default_factory=TrainsideEngineConfig)


class ARSFTPhase(SFTPhaseBase):
    algorithm: TokenSFTConfig = Field(default_factory=TokenSFTConfig)


class Recipe(RunSettings):
    """A causal-LM run: optional token-SFT warm-start on (prompt, answer) pairs, then RL (GRPO family).

    ``model.kind: vlm`` makes it image-conditioned (a visual-question world's prompts carry images)."""

    trainer: Literal["ar"] = "ar"
    model: ModelConfig
    data: DataConfig
    sampling: ARSamplingParams
    eval_sampling: ARSamplingParams | None = Field(
        default=None,
        description="sampling for held-out evaluation (default: `sampling` with top_k=1, greedy)",
    )
    prompt_template: str = Field(default="{prompt}", description="str.format template with a {prompt} field")
    backend: BackendConfig
    reward: ServiceConfig
    sft: ARSFTPhase | None = None
    rl: RLPhase | None = None
    rollout: ARRolloutConfig = Field(
        default_factory=ARRolloutConfig, description="rollout engine (trainside: the training module itself)"
    )

    def backend_config(self) -> BackendConfig:
        return self.backend

    def build_policy(
        self, device: torch.device, *, stage: str = "ar", rollout_copy: bool = False
    ) -> Policy[CausalLMBundle, ARPipeline | VLMPipeline]:
        """The bundle (``model`` on ``device``) and its pipeline, as every process of the run builds
        them. The trainer's decodes with ``rollout.engine.decoder`` (trainside); a ``rollout_copy``
        (Ray rollout worker, async rollout thread) and a dedicated engine's reference decode dynamic."""
        bundle = self.model.model_copy(update={"device": str(device)}).build()
        engine = self.rollout.engine
        decoder = engine.decoder if engine.kind == "trainside" and not rollout_copy else "dynamic"
        pipeline = self.model.pipeline(
            bundle,  # type: ignore[arg-type]  # each model config pairs with its own bundle
            self.sampling,
            stage=stage,
            prompt_template=self.prompt_template,
            decoder=decoder,
        )
        return Policy(bundle, pipeline, bundle.model)

    @model_validator(mode="after")
    def _dedicated_engine(self) -> Recipe:
        if self.model.kind == "vlm" and self.rollout.engine.kind != "trainside":
            raise ValueError(
                f"model.kind='vlm' samples trainside only; got rollout.engine.kind={self.rollout.engine.kind!r}"
            )
        if self.rollout.engine.kind == "vllm" and self.backend.lora is not None:
            raise ValueError(
                "rollout.engine.kind='vllm' with backend.lora is not supported yet (the engine loads "
                "merged full weights under the model's own names); drop backend.lora or use kind='trainside'"
            )
        if self.rl is not None and self.rl.lifecycle == "async":
            self._async_engine()
        return self

    def _async_engine(self) -> None:
        """The async lifecycle samples trainside or with vLLM: on one process an engine the rollout
        thread feeds (``unirl.apps.asynchronous.engine_side``), on Ray the rollout workers' engines."""
        kind, rl = self.rollout.engine.kind, self.rl
        assert rl is not None
        if kind not in ("trainside", "vllm"):
            raise ValueError(
                f"rl.lifecycle='async' with rollout.engine.kind={kind!r} is not supported yet (an async "
                "rollout samples with a trainside copy or a vLLM engine); use kind='trainside' or 'vllm'"
            )
        if kind == "vllm" and rl.buffer.partial_rollouts:
            raise ValueError(
                "rl.buffer.partial_rollouts=true with rollout.engine.kind='vllm': the engine generates a "
                "request whole, it cannot take new weights mid-sequence; use kind='trainside' or drop it"
            )


def engine_model_dir(recipe: Recipe, bundle: CausalLMBundle, scratch: Path) -> Path:
    """Where a dedicated engine loads its initial weights: the model's own local directory, else
    (built in code, GGUF, 'pkg:') ``bundle``'s weights saved to ``scratch``."""
    path = recipe.model.path
    if path and recipe.model.gguf_file is None and (Path(path) / "config.json").is_file():
        return Path(path)
    return Path(bundle.save_pretrained(scratch))
