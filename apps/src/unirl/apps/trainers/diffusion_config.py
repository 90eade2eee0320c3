"""The diffusion recipe: every field typed, validated before any compute."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from unirl.apps.data import PromptListConfig
from unirl.apps.models import DiffusionModelConfig
from unirl.apps.trainers.phases import RLPhase, RunSettings, SFTPhaseBase
from unirl.apps.worlds.shapes_source import ShapesDataConfig
from unirl.reward.config import ServiceConfig
from unirl.train.algorithms import FlowSFTConfig
from unirl.train.backends.fsdp import FSDPConfig
from unirl.types import DiffusionSamplingParams

DataConfig = Annotated[PromptListConfig | ShapesDataConfig, Field(discriminator="kind")]


class DiffusionSFTPhase(SFTPhaseBase):
    algorithm: FlowSFTConfig = Field(default_factory=FlowSFTConfig)


class Recipe(RunSettings):
    """A diffusion / flow-matching run: optional SFT warm-start on (image, caption) pairs, then RL."""

    trainer: Literal["diffusion"] = "diffusion"
    model: DiffusionModelConfig
    data: DataConfig
    sampling: DiffusionSamplingParams
    backend: FSDPConfig
    reward: ServiceConfig
    sft: DiffusionSFTPhase | None = None
    rl: RLPhase | None = None
