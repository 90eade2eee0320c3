"""The prompt-enhancer recipe: two sibling stacks (``ar``, ``diffusion``), each optional to train.

An AR policy rewrites the user's prompt, a diffusion model renders the rewrite, the reward scores
each image against the ORIGINAL prompt. Each stack has its own model, backend (optimizer, LR
schedule), SFT phase and RL settings (algorithm, advantage, geometry, LR, update cadence); a stack
whose ``rl`` is null is frozen during RL (it still samples).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from unirl.apps.asynchronous.config import LifecycleFields
from unirl.apps.models import DiffusionModelConfig
from unirl.apps.trainers.ar_config import ARSFTPhase
from unirl.apps.trainers.diffusion_config import DiffusionSFTPhase
from unirl.apps.trainers.phases import STRICT, RunSettings
from unirl.apps.worlds.shapes_paraphrase import ShapesParaphraseDataConfig
from unirl.reward.config import ServiceConfig
from unirl.rollout.ar.config import CausalLMConfig
from unirl.train.algorithms import (
    AlgorithmConfig,
    DRPOConfig,
    FlowDPPOConfig,
    FlowGRPOConfig,
    GRPOConfig,
    GSPOConfig,
)
from unirl.train.algorithms.flow_grpo import DanceGRPOConfig, MixGRPOConfig
from unirl.train.backends.config import BackendConfig
from unirl.train.geometry import BatchGeometry
from unirl.types import AdvantageConfig, ARSamplingParams, DiffusionSamplingParams
from unirl.types.lineage import CreditReduce

ARAlgorithm = Annotated[GRPOConfig | GSPOConfig | DRPOConfig, Field(discriminator="kind")]
DiffusionAlgorithm = Annotated[
    FlowGRPOConfig | DanceGRPOConfig | MixGRPOConfig | FlowDPPOConfig, Field(discriminator="kind")
]


class StackRL(BaseModel):
    """How one stack trains during the PE RL phase (absent: the stack is frozen)."""

    model_config = STRICT
    advantage: AdvantageConfig = Field(
        default_factory=AdvantageConfig,
        description="AR: grouped by prompt (its samples_per_prompt rewrites); diffusion: grouped by "
        "AR sample (its images_per_rewrite renders)",
    )
    geometry: BatchGeometry
    lr: float | None = Field(
        default=None, gt=0, description="overrides this stack's backend.optimizer.lr in RL"
    )
    every: int = Field(default=1, ge=1, description="update cadence: train this stack on every N-th PE step")
    reset_optimizer: bool = Field(
        default=False, description="fresh optimizer state when RL starts (not on resume)"
    )


class ARStackRL(StackRL):
    algorithm: ARAlgorithm


class DiffusionStackRL(StackRL):
    algorithm: DiffusionAlgorithm


class ARStack(BaseModel):
    """The prompt enhancer: a causal LM that reads the user's prompt and writes the rewrite."""

    model_config = STRICT
    model: CausalLMConfig
    sampling: ARSamplingParams
    eval_sampling: ARSamplingParams | None = Field(
        default=None, description="held-out evaluation (default: `sampling` with top_k=1, greedy)"
    )
    prompt_template: str = Field(default="{prompt}", description="str.format template with a {prompt} field")
    backend: BackendConfig
    sft: ARSFTPhase | None = Field(
        default=None, description="token SFT on the data's (user prompt, rewrite) pairs"
    )
    rl: ARStackRL | None = Field(default=None, description="null: the enhancer is frozen during RL")


class DiffusionStack(BaseModel):
    """The renderer: a text-to-image flow model conditioned on the rewrite."""

    model_config = STRICT
    model: DiffusionModelConfig
    sampling: DiffusionSamplingParams
    backend: BackendConfig
    sft: DiffusionSFTPhase | None = Field(
        default=None, description="flow-matching SFT on (image, caption) renders"
    )
    rl: DiffusionStackRL | None = Field(default=None, description="null: the renderer is frozen during RL")


class PERLPhase(LifecycleFields):
    """One PE step: ``prompts_per_step`` prompts x ``samples_per_prompt`` rewrites x ``images_per_rewrite``."""

    model_config = STRICT
    steps: int = Field(ge=0)
    prompts_per_step: int = Field(ge=1)
    samples_per_prompt: int = Field(ge=1, description="AR rewrites per prompt (the AR advantage group)")
    images_per_rewrite: int = Field(ge=1, description="renders per rewrite, M (the image advantage group)")
    credit: CreditReduce = Field(
        default="mean", description="the AR parent's reward: mean | max | min of its M images"
    )

    @model_validator(mode="after")
    def _no_partial(self) -> PERLPhase:
        if self.buffer.partial_rollouts:
            raise ValueError(
                "rl.buffer.partial_rollouts=true: a PE rewrite is not continued across weight versions "
                "(its renders are conditioned on it whole); set rl.buffer.partial_rollouts=false"
            )
        return self

    @property
    def algorithm(self) -> None:
        """None: each stack names its own (``ar.rl.algorithm``, ``diffusion.rl.algorithm``)."""
        return None

    def backend_algorithms(self) -> dict[str, AlgorithmConfig]:
        """None: each stack has its own backend, against whose reference its KL is checked."""
        return {}


class PESFT:
    """The two stacks' SFT phases run one after the other: the renderer's, then the enhancer's
    (``steps`` = their sum; the run's SFT cursor counts across both)."""

    def __init__(self, diffusion: DiffusionSFTPhase | None, ar: ARSFTPhase | None) -> None:
        self.diffusion, self.ar = diffusion, ar
        self.diffusion_steps = diffusion.steps if diffusion is not None else 0
        self.steps = self.diffusion_steps + (ar.steps if ar is not None else 0)
        self.stop = None


class Recipe(RunSettings):
    """A prompt-enhancer run: SFT of each stack (optional), then PE RL with either or both trainable."""

    trainer: Literal["pe"] = "pe"
    data: ShapesParaphraseDataConfig
    reward: ServiceConfig = Field(description="scores each image against the ORIGINAL prompt")
    ar: ARStack
    diffusion: DiffusionStack
    rl: PERLPhase | None = None
    eval_unenhanced: bool = Field(
        default=True,
        description="after SFT (and after RL when the renderer trains) also evaluate the renderer on "
        "the raw user prompts (`<stage>_unenhanced`, the baseline) and on their canonical captions "
        "(`<stage>_oracle`, the ceiling a perfect rewrite reaches)",
    )

    @property
    def sft(self) -> PESFT | None:
        if self.ar.sft is None and self.diffusion.sft is None:
            return None
        return PESFT(self.diffusion.sft, self.ar.sft)

    @model_validator(mode="after")
    def _pe(self) -> Recipe:
        if self.layout.kind != "single":
            raise ValueError(f"layout.kind={self.layout.kind!r}: the PE trainer runs in one process for now")
        for name, sft in (("ar", self.ar.sft), ("diffusion", self.diffusion.sft)):
            if sft is not None and sft.stop is not None:
                raise ValueError(
                    f"{name}.sft.stop is not supported by the PE trainer yet; give {name}.sft.steps"
                )
        if self.checkpoint_format != "full":
            raise ValueError("checkpoint_format='sharded' is not supported by the PE trainer yet; use 'full'")
        if self.rl is None:
            return self
        n_ar = self.rl.prompts_per_step * self.rl.samples_per_prompt
        for name, stack, n in (
            ("ar", self.ar, n_ar),
            ("diffusion", self.diffusion, n_ar * self.rl.images_per_rewrite),
        ):
            if stack.rl is None:
                continue
            try:
                stack.rl.geometry.check_shard(n)
            except ValueError as e:
                raise ValueError(f"{name}.rl.geometry: a PE step gives this stack {n} parts: {e}") from e
            kl = stack.rl.algorithm.kl_weight
            if kl and stack.backend.reference == "none":
                raise ValueError(
                    f"{name}.rl.algorithm.kl_coef={kl} needs {name}.backend.reference=frozen_copy (or lora_base)"
                )
        if self.rl.steps and self.ar.rl is None and self.diffusion.rl is None:
            raise ValueError("rl.steps > 0 but neither ar.rl nor diffusion.rl is set: no stack would train")
        return self
