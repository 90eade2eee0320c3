"""The diffusion recipe: every field typed, validated before any compute."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from unirl.apps.data import PromptListConfig
from unirl.apps.models import DiffusionModelConfig
from unirl.apps.worlds.shapes_source import ShapesDataConfig
from unirl.reward.config import ServiceConfig
from unirl.train.algorithms import AlgorithmConfig, FlowSFTConfig
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.geometry import BatchGeometry
from unirl.types import AdvantageConfig, DiffusionSamplingParams

_STRICT = ConfigDict(extra="forbid", frozen=True)


DataConfig = Annotated[PromptListConfig | ShapesDataConfig, Field(discriminator="kind")]


class SFTPhase(BaseModel):
    """Supervised warm-start on (image, caption) pairs from the data source (worlds only)."""

    model_config = _STRICT
    steps: int = Field(ge=0, description="optimizer steps; 0 skips the phase")
    batch_size: int = Field(ge=1)
    lr: float | None = Field(default=None, gt=0, description="overrides backend.optimizer.lr for this phase")
    algorithm: FlowSFTConfig = Field(default_factory=FlowSFTConfig)
    micro_batch_size: int | None = Field(default=None, ge=1, description="default: batch_size")


class RLPhase(BaseModel):
    """RL: rollout -> reward -> advantage -> train, ``steps`` times."""

    model_config = _STRICT
    steps: int = Field(ge=0)
    prompts_per_step: int = Field(ge=1)
    samples_per_prompt: int = Field(ge=1, description="group size; advantages are normalised within a group")
    algorithm: AlgorithmConfig
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    geometry: BatchGeometry
    lr: float | None = Field(default=None, gt=0, description="overrides backend.optimizer.lr for this phase")

    @model_validator(mode="after")
    def _shard(self) -> RLPhase:
        self.geometry.check_shard(self.prompts_per_step * self.samples_per_prompt)
        return self


class EvalConfig(BaseModel):
    model_config = _STRICT
    num_prompts: int = Field(default=32, ge=0, description="held-out prompts per evaluation (0 = off)")
    every: int = Field(default=0, ge=0, description="evaluate every N RL steps (0 = only before/after)")
    grid_size: int = Field(default=8, ge=0, description="images in the before/after sample grids")
    success_threshold: float = Field(default=0.999, description="reward >= this counts as correct (accuracy)")


class Recipe(BaseModel):
    """A diffusion / flow-matching run: optional SFT warm-start, then RL."""

    model_config = _STRICT
    trainer: Literal["diffusion"] = "diffusion"
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads (None = torch default)")
    model: DiffusionModelConfig
    data: DataConfig
    sampling: DiffusionSamplingParams
    backend: FSDPConfig
    reward: ServiceConfig
    sft: SFTPhase | None = None
    rl: RLPhase | None = None
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint_every: int = Field(default=0, ge=0, description="RL steps between checkpoints (0 = end only)")

    @model_validator(mode="after")
    def _phases(self) -> Recipe:
        if self.sft is None and self.rl is None:
            raise ValueError("the recipe has neither an `sft` nor an `rl` phase: nothing to run")
        return self
