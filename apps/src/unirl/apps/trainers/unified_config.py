"""The unified-model recipe: one backbone that thinks (text track) then draws (image track).

One model, one backend (one optimizer, full fine-tune or LoRA through ``backend.lora``), two
tracks: ``ar`` (the plan, a text Part; an AR policy loss) and ``image`` (the drawing, a latent
trajectory Part; a diffusion RL loss). SFT trains both on (user prompt, canonical caption as plan,
render); RL credits the one image reward (scored against the ORIGINAL prompt) to both Parts, and
each step's gradient is ``ar.weight * grad L_ar + image.weight * grad L_image``, each loss divided
by its own global totals.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from unirl.apps.asynchronous.config import LifecycleFields
from unirl.apps.trainers.phases import STRICT, RunSettings, SFTPhaseBase
from unirl.apps.worlds.shapes_paraphrase import ShapesParaphraseDataConfig
from unirl.reward.config import ServiceConfig
from unirl.train.algorithms import (
    AlgorithmConfig,
    DiffusionNFTConfig,
    DRPOConfig,
    FlowDPPOConfig,
    FlowGRPOConfig,
    FlowSFTConfig,
    GRPOConfig,
    GSPOConfig,
    TokenSFTConfig,
)
from unirl.train.algorithms.flow_grpo import DanceGRPOConfig, MixGRPOConfig
from unirl.train.backends.config import BackendConfig
from unirl.train.geometry import BatchGeometry
from unirl.types import AdvantageConfig, ARSamplingParams, DiffusionSamplingParams

ARAlgorithm = Annotated[GRPOConfig | GSPOConfig | DRPOConfig, Field(discriminator="kind")]
ImageAlgorithm = Annotated[
    FlowGRPOConfig | DanceGRPOConfig | MixGRPOConfig | FlowDPPOConfig | DiffusionNFTConfig,
    Field(discriminator="kind"),
]


class TinyUnifiedModelConfig(BaseModel):
    """The in-project unified model (``unirl.rollout.unified.TinyUnifiedModel``): built from these
    sizes over the data's words, or loaded from ``path`` (a ``save_pretrained`` directory)."""

    model_config = STRICT
    kind: Literal["tiny_unified"] = "tiny_unified"
    path: str | None = Field(default=None, description="load this save_pretrained dir (sizes then ignored)")
    hidden_size: int = Field(default=64, ge=8)
    num_layers: int = Field(default=3, ge=1)
    num_heads: int = Field(default=4, ge=1)
    mlp_ratio: int = Field(default=4, ge=1)
    max_text_len: int = Field(default=24, ge=4, description="text positions: prompt + plan + separators")
    conv_channels: tuple[int, int] = Field(default=(16, 32), description="conv encoder / decoder widths")


class TrackSFT(BaseModel):
    model_config = STRICT
    weight: float = Field(default=1.0, ge=0.0, description="this track's share of the summed SFT loss")


class UnifiedSFTPhase(SFTPhaseBase):
    """Both tracks on (prompt, canonical caption as plan, its render): token CE + flow-matching MSE."""

    ar: TokenSFTConfig = Field(default_factory=TokenSFTConfig)
    image: FlowSFTConfig = Field(default_factory=FlowSFTConfig)
    ar_weight: float = Field(default=1.0, ge=0.0, description="weight of the text track's loss")
    image_weight: float = Field(default=1.0, ge=0.0, description="weight of the image track's loss")


class ARTrack(BaseModel):
    model_config = STRICT
    algorithm: ARAlgorithm
    weight: float = Field(default=1.0, ge=0.0, description="weight of the AR-track loss in the one step")


class ImageTrack(BaseModel):
    model_config = STRICT
    algorithm: ImageAlgorithm
    weight: float = Field(default=1.0, ge=0.0, description="weight of the image-track loss in the one step")


class UnifiedRLPhase(LifecycleFields):
    """RL: prompts -> think + draw -> one image reward -> advantages (both Parts, grouped by prompt)
    -> one optimizer step from the two tracks' losses."""

    model_config = STRICT
    steps: int = Field(ge=0)
    prompts_per_step: int = Field(ge=1)
    samples_per_prompt: int = Field(ge=1, description="group size of both tracks' advantages")
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    geometry: BatchGeometry = Field(
        description="over Samples: each mini-batch holds both Parts of its Samples"
    )
    lr: float | None = Field(default=None, gt=0, description="overrides backend.optimizer.lr in RL")
    reset_optimizer: bool = Field(default=False, description="fresh optimizer state when RL starts")
    ar: ARTrack | None = Field(description="the text track's loss (null: the plan is sampled, not trained)")
    image: ImageTrack | None = Field(description="the image track's loss (null: drawn, not trained)")
    dynamic_sampling: None = None

    @property
    def algorithm(self) -> None:
        """None: each track names its own (``rl.ar.algorithm``, ``rl.image.algorithm``)."""
        return None

    def backend_algorithms(self) -> dict[str, AlgorithmConfig]:
        """Both tracks train the one backbone: their KLs share ``backend.reference``."""
        tracks = {"rl.ar.algorithm": self.ar, "rl.image.algorithm": self.image}
        return {f: t.algorithm for f, t in tracks.items() if t is not None}

    @model_validator(mode="after")
    def _tracks(self) -> UnifiedRLPhase:
        self.geometry.check_shard(self.prompts_per_step * self.samples_per_prompt)
        if self.steps and self.ar is None and self.image is None:
            raise ValueError("rl.steps > 0 but neither rl.ar nor rl.image is set: nothing would train")
        if self.buffer.partial_rollouts:
            raise ValueError(
                "rl.buffer.partial_rollouts=true: the unified trainer's text track is not continued across "
                "weight versions (the plan conditions the image); set rl.buffer.partial_rollouts=false"
            )
        return self


class Recipe(RunSettings):
    """A unified-model run on the shapes paraphrase world: SFT of both tracks, then RL of both."""

    trainer: Literal["unified"] = "unified"
    data: ShapesParaphraseDataConfig
    reward: ServiceConfig = Field(description="scores each image against the ORIGINAL prompt")
    model: TinyUnifiedModelConfig
    ar_sampling: ARSamplingParams = Field(description="how the plan is sampled in RL")
    eval_ar_sampling: ARSamplingParams | None = Field(
        default=None, description="the plan at evaluation (default: ar_sampling with top_k=1, greedy)"
    )
    image_sampling: DiffusionSamplingParams = Field(description="RL rollout of the image head (the SDE)")
    backend: BackendConfig
    sft: UnifiedSFTPhase | None = None
    rl: UnifiedRLPhase | None = None

    def backend_config(self) -> BackendConfig:
        return self.backend

    @model_validator(mode="after")
    def _unified(self) -> Recipe:
        if self.layout.kind != "single":
            raise ValueError(
                f"layout.kind={self.layout.kind!r}: the unified trainer runs in one process for now"
            )
        res = self.data.resolution
        if (self.image_sampling.height, self.image_sampling.width) != (res, res):
            raise ValueError(
                f"image_sampling.height/width={self.image_sampling.height}/{self.image_sampling.width} but "
                f"data.resolution={res}: set both to {res}"
            )
        if self.image_sampling.guidance_scale > 1.0:
            raise ValueError("image_sampling.guidance_scale > 1: the unified image head samples without CFG")
        if self.sft is not None and self.sft.stop is not None:
            raise ValueError("sft.stop is not supported by the unified trainer yet; give sft.steps")
        if self.checkpoint_format != "full":
            raise ValueError("checkpoint_format='sharded' is not supported by the unified trainer yet")
        alg = self.rl.image.algorithm if self.rl is not None and self.rl.image is not None else None
        if isinstance(alg, DiffusionNFTConfig):
            # NFT's old policy is the backend's EMA: the image track samples (ODE) with it, the text
            # track with the live weights (its GRPO ratio stays on-policy)
            want, ema = alg.ema_config(), self.backend.ema
            if ema is None or (ema.decay, ema.ramp) != (want["decay"], want["ramp"]):
                raise ValueError(
                    f"rl.image.algorithm.kind=diffusion_nft uses the backend's EMA as its old policy: set "
                    f"backend.ema={{decay: {want['decay']}, ramp: {want['ramp']}}}"
                )
            if self.image_sampling.sde_strategy != "ode" or self.image_sampling.eta != 0.0:
                raise ValueError(
                    "rl.image.algorithm.kind=diffusion_nft learns from ODE samples: set "
                    "image_sampling.sde_strategy=ode and image_sampling.eta=0"
                )
        return self
