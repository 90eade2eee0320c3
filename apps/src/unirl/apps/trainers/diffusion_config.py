"""The diffusion recipe: every field typed, validated before any compute."""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field, model_validator

from unirl.apps.data import FramedVideos, PromptListConfig, SizedImages
from unirl.apps.models import (
    DiffusionModelConfig,
    FluxModelConfig,
    SD3ModelConfig,
    TinyShapesModelConfig,
    TinyVideoModelConfig,
)
from unirl.apps.trainers.components import Policy
from unirl.apps.trainers.diffusion_rollout import DiffusionRolloutConfig, TrainsideDiffusionEngineConfig
from unirl.apps.trainers.phases import RLPhase, RunSettings, SFTPhaseBase
from unirl.apps.worlds.moving_shapes import MovingShapesDataConfig
from unirl.apps.worlds.shapes_source import ShapesDataConfig
from unirl.reward.config import ServiceConfig
from unirl.rollout.engines.sglang_diffusion import SDE_TYPES as SGLANG_SDE
from unirl.rollout.engines.vllm_omni import SDE_TYPES as OMNI_SDE
from unirl.rollout.models.base import FlowBundle
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.train.algorithms import DiffusionNFTConfig, FlowSFTConfig
from unirl.train.backends.config import BackendConfig
from unirl.types import DiffusionSamplingParams

DataConfig = Annotated[
    PromptListConfig | ShapesDataConfig | MovingShapesDataConfig, Field(discriminator="kind")
]


class DiffusionSFTPhase(SFTPhaseBase):
    algorithm: FlowSFTConfig = Field(default_factory=FlowSFTConfig)


class Recipe(RunSettings):
    """A diffusion / flow-matching run: optional SFT warm-start on (image, caption) pairs, then RL."""

    trainer: Literal["diffusion"] = "diffusion"
    model: DiffusionModelConfig
    data: DataConfig
    sampling: DiffusionSamplingParams
    backend: BackendConfig
    reward: ServiceConfig
    sft: DiffusionSFTPhase | None = None
    rl: RLPhase | None = None
    rollout: DiffusionRolloutConfig = Field(
        default_factory=DiffusionRolloutConfig,
        description="rollout engine (trainside: the training module itself; sglang / vllm_omni: a server)",
    )

    def backend_config(self) -> BackendConfig:
        return self.backend

    def rollout_params(self) -> DiffusionSamplingParams:
        """``sampling`` with what the RL algorithm requires (e.g. DanceGRPO's SDE strategy)."""
        overrides = self.rl.algorithm.sampling_overrides() if self.rl else {}
        return self.sampling.model_copy(update=overrides) if overrides else self.sampling

    def build_policy(
        self, device: torch.device, *, stage: str = "diffusion", rollout_copy: bool = False
    ) -> Policy[FlowBundle, FlowMatchPipeline]:
        """The bundle (``model``, seeded by ``seed``) and its FlowMatchPipeline, as every process of
        the run builds them (a rollout copy samples the same; ``rollout_copy`` changes nothing here)."""
        bundle = self.model.build(device, self.seed)
        alg = self.rl.algorithm if self.rl else None
        pipeline = FlowMatchPipeline(
            bundle,
            stage=stage,
            default_params=self.rollout_params(),
            record_old_means=alg is not None and alg.kind == "flow_dppo",
        )
        return Policy(bundle, pipeline, bundle.transformer)

    @model_validator(mode="after")
    def _remote_engine(self) -> Recipe:
        """What an HTTP diffusion server cannot do (it holds its own full weights, returns no Gaussian
        means, samples no EMA copy, and one server is not a Ray rollout worker)."""
        kind = self.rollout.engine.kind
        if isinstance(self.rollout.engine, TrainsideDiffusionEngineConfig):
            return self
        alg = self.rl.algorithm.kind if self.rl is not None else None
        why = {
            "backend.lora": (self.backend.lora is not None, "the server loads full weights, no adapters; drop backend.lora"),
            f"rl.algorithm.kind={alg!r}": (alg in ("flow_dppo", "diffusion_nft"), "it needs the rollout's Gaussian means / "
                                          "EMA sampling, which a server does not return; use flow_grpo"),
            "rl.lifecycle='async'": (self.rl is not None and self.rl.lifecycle == "async",
                                     "the async rollout thread samples with a trainside copy; use rl.lifecycle=sync"),
            f"layout.kind={self.layout.kind!r}": (self.layout.kind != "single",
                                                  "the Ray rollout workers sample trainside; use layout.kind=single"),
        }  # fmt: skip
        strategies = [*sorted(SGLANG_SDE if kind == "sglang" else OMNI_SDE), "ode"]
        why[f"sampling.sde_strategy={self.sampling.sde_strategy!r}"] = (
            self.sampling.sde_strategy not in strategies,
            f"{kind} implements {strategies}",
        )
        for what, (bad, fix) in why.items():
            if bad:
                raise ValueError(
                    f"rollout.engine.kind={kind!r} with {what} is not supported: {fix} (or use kind=trainside)"
                )
        return self

    @model_validator(mode="after")
    def _megatron_needs_an_mmdit(self) -> Recipe:
        """backend.kind=megatron builds an SD3 or FLUX MMDiT's blocks on megatron-core: the model
        must be one (``kind: sd3`` / ``flux``, or ``kind: tiny_shapes`` with ``arch: sd3``)."""
        if self.backend.kind != "megatron":
            return self
        m = self.model
        mmdit = isinstance(m, SD3ModelConfig | FluxModelConfig)
        if not (mmdit or (isinstance(m, TinyShapesModelConfig) and m.arch == "sd3")):
            what = f"model.kind={m.kind!r}" + (
                f", model.arch={m.arch!r}" if isinstance(m, TinyShapesModelConfig) else ""
            )
            raise ValueError(
                f"backend.kind='megatron' with {what}: the megatron backend trains the SD3 and FLUX MMDiTs "
                "(model.kind=sd3 or flux, or tiny_shapes with model.arch=sd3) and causal LMs; use backend.kind=fsdp"
            )
        if self.rollout.engine.kind != "trainside":
            raise ValueError(
                f"backend.kind='megatron' with rollout.engine.kind={self.rollout.engine.kind!r}: the megatron "
                "MMDiT samples trainside only (in the trainer's process, or on the Ray rollout workers' "
                "diffusers copies); use rollout.engine.kind=trainside"
            )
        return self

    @model_validator(mode="after")
    def _pixel_sizes(self) -> Recipe:
        """The pixel-space tiny model samples at its own resolution, on images of the data's size:
        otherwise the U-Net would fail (or silently resize) only once a model is built."""
        if not isinstance(self.model, TinyShapesModelConfig):
            return self
        res = self.model.resolution
        if (self.sampling.height, self.sampling.width) != (res, res):
            raise ValueError(
                f"sampling.height={self.sampling.height}, sampling.width={self.sampling.width} but "
                f"model.resolution={res}: the tiny pixel model samples {res}x{res} images; set "
                f"sampling.height={res} sampling.width={res} (or change model.resolution)"
            )
        data_res = self.data.resolution if isinstance(self.data, SizedImages) else res
        if data_res != res:
            raise ValueError(
                f"data.resolution={data_res} but model.resolution={res}: SFT images and the model must "
                f"have one size; set data.resolution={res} (or model.resolution={data_res} and the sampling sizes)"
            )
        return self

    @model_validator(mode="after")
    def _video_sizes(self) -> Recipe:
        """The tiny video model samples videos of the data's frame size and length."""
        if not isinstance(self.model, TinyVideoModelConfig):
            return self
        res, s = self.model.resolution, self.sampling
        frames = self.data.num_frames if isinstance(self.data, FramedVideos) else s.num_frames
        if s.num_frames is None or (s.height, s.width, s.num_frames) != (res, res, frames):
            raise ValueError(
                f"sampling.height={s.height}, sampling.width={s.width}, sampling.num_frames={s.num_frames} "
                f"but model.resolution={res} and data.num_frames={frames}: set sampling.height={res} "
                f"sampling.width={res} sampling.num_frames={frames}"
            )
        data_res = self.data.resolution if isinstance(self.data, SizedImages) else res
        if data_res != res:
            raise ValueError(f"data.resolution={data_res} but model.resolution={res}: make them equal")
        return self

    @model_validator(mode="after")
    def _nft_old_policy(self) -> Recipe:
        """DiffusionNFT's old policy is the backend's EMA: it must exist and decay as NFT says."""
        alg = self.rl.algorithm if self.rl is not None else None
        if not isinstance(alg, DiffusionNFTConfig):
            return self
        want = alg.ema_config()
        ema = self.backend.ema
        if ema is None or (ema.decay, ema.ramp) != (want["decay"], want["ramp"]):
            got = None if ema is None else {"decay": ema.decay, "ramp": ema.ramp}
            raise ValueError(
                f"rl.algorithm.kind=diffusion_nft uses the backend's EMA as its old policy, but "
                f"backend.ema={got}: set backend.ema={{decay: {want['decay']}, ramp: {want['ramp']}}} "
                "(rl.algorithm.ema_cap / ema_rate)"
            )
        return self
