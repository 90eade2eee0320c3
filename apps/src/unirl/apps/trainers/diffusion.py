"""DiffusionTrainer: the diffusion / flow-matching domain of the shared lifecycle (see base.py).

SFT regresses the velocity on (image, caption) pairs of the data source; RL samples with the
``rollout.engine`` (trainside: the SDE with per-step log-probs; sglang / vllm_omni: an HTTP server,
checked by the sigma echo and log-prob parity, see diffusion_rollout.py), scores the decoded images and trains the
configured StageAlgorithm. Evaluation samples held-out prompts with the ODE (eta = 0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from unirl.apps.data import SFTImages
from unirl.apps.evalstats import pairwise_diversity
from unirl.apps.launch import run_trainer
from unirl.apps.loop import StopFlag
from unirl.apps.plots import sample_grid
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.base import Trainer
from unirl.apps.trainers.components import NoSteps
from unirl.apps.trainers.diffusion_config import Recipe
from unirl.apps.trainers.diffusion_rollout import RemoteDiffusionRollout, build_engine
from unirl.apps.trainers.phases import RunSettings
from unirl.reward.service import RewardService
from unirl.rollout.models.base import EncodesImages
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.train.algorithms import ContextReference, UsesOldPolicy, UsesReference
from unirl.types import DiffusionSamplingParams, LatentTrajectory, Part, Sample, VideoPrimitive, to_numpy

__all__ = ["DiffusionTrainer", "Recipe", "run"]


class DiffusionTrainer(Trainer):
    stage = "diffusion"
    cfg: Recipe
    pipeline: FlowMatchPipeline

    def __init__(self, recipe: Recipe, run_dir: RunDir) -> None:
        super().__init__(recipe, run_dir)
        policy = recipe.build_policy(self.device, stage=self.stage)
        self.bundle, self.pipeline = policy.bundle, policy.pipeline
        self.data = recipe.data.build()
        alg = recipe.rl.algorithm if recipe.rl else None
        self.backend = recipe.backend.build(self.bundle.transformer, device=self.device)
        if self.backend.module is not self.bundle.transformer:  # megatron: the MMDiT on megatron-core
            self.bundle.replace_transformer(self.backend.module)  # samples, replays and trains
        self.engine = build_engine(recipe.rollout, self.pipeline, lambda: self.backend.global_step)
        self.reward = RewardService.from_config(recipe.reward)
        self.algorithm = alg.build() if alg is not None else None
        self.steps = self.make_steps(recipe, self.algorithm)
        if alg is not None and isinstance(self.algorithm, UsesReference) and alg.needs_reference:
            self.algorithm.set_reference(ContextReference(self.pipeline, self.backend.reference_weights))
        if isinstance(self.algorithm, UsesOldPolicy):  # DiffusionNFT: the EMA is its old policy
            self.algorithm.set_old_policy(self.backend.ema_weights)

    @classmethod
    def make_steps(cls, recipe: RunSettings, algorithm: object) -> DiffusionSteps:
        return DiffusionSteps(cls.stage)

    @property
    def ema_rollout(self) -> bool:
        return self.cfg.rl is not None and self.cfg.rl.algorithm.kind == "diffusion_nft"

    def after_train_step(self) -> dict[str, float]:
        """A remote engine's guard metrics of this step's rollout (sigma echo, log-prob parity)."""
        return self.engine.metrics() if isinstance(self.engine, RemoteDiffusionRollout) else {}

    def run_all(self, mode: str, stop: StopFlag) -> None:
        try:
            super().run_all(mode, stop)
        finally:
            if isinstance(self.engine, RemoteDiffusionRollout):
                self.engine.close()

    def sft_parts(self, batch_size: int, step: int) -> list[Part]:
        if not isinstance(self.data, SFTImages):
            raise ValueError(f"sft needs (image, caption) data; data.kind={self.cfg.data.kind!r} has none")
        images, captions = self.data.sft_examples(batch_size, seed=self.cfg.seed, step=step)
        if not isinstance(self.bundle, EncodesImages):
            raise TypeError(f"sft: {type(self.bundle).__name__} cannot encode images to latents")
        with torch.no_grad():
            x0 = self.bundle.encode_images(torch.from_numpy(images).to(self.device)).float().cpu()
        conds = self.bundle.encode_prompts(captions)
        return [
            Part.model_construct(
                name=self.stage,
                segment=LatentTrajectory.model_construct(
                    kind="latent", latents=x[None], positions=[1], sigmas=[1.0, 0.0], sde_indices=[]
                ),
                conditions=c,
                outputs=[],
                status="completed",
            )
            for x, c in zip(x0, conds)
        ]

    def eval_params(self) -> DiffusionSamplingParams:
        """ODE sampling, each held-out sample from its own initial noise (also when RL's rollout
        shares it within a group, ``sampling.noise.scope=group``: k identical ODE samples would
        make accuracy and pass@k a one-sample measure)."""
        params = self.cfg.rollout_params()
        noise = params.noise.model_copy(update={"scope": "sample"})
        return params.model_copy(update={"eta": 0.0, "sde_strategy": "ode", "noise": noise})


class DiffusionSteps(NoSteps):
    """The diffusion domain's model-free steps: image / film-strip grids and pixel diversity."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def sample_diversity(self, samples: list[Sample]) -> float | None:
        """Mean pixel difference of one prompt's images, pair by pair (None for one sample a prompt)."""
        if len(samples) < 2:
            return None
        return pairwise_diversity([media_array(s.part(self.stage)) for s in samples])

    def save_grid(self, samples: list[Sample], rewards: list[float], path: Path) -> Path:
        imgs = [media_array(s.part(self.stage), strip=True) for s in samples]
        cols = 2 if imgs and imgs[0].shape[1] > imgs[0].shape[0] else 4  # film strips: 2 a row
        caps = [f"{s.prompt} | r={r:.2f}" for s, r in zip(samples, rewards)]
        return sample_grid(imgs, caps, path, cols=cols)


def media_array(part: Part, *, strip: bool = False) -> np.ndarray:
    """The Part's decoded output as uint8: an image [H, W, 3], or a video [F, H, W, 3]; with
    ``strip`` a video becomes one film strip [H, F * (W + 1) - 1, 3] (frames left to right, grey gaps)."""
    out = part.outputs[0]
    if not isinstance(out, VideoPrimitive):
        return np.asarray(to_numpy(out.pixels))  # type: ignore[union-attr]
    frames = np.asarray(to_numpy(out.frames))
    if not strip:
        return frames
    f, h, w, c = frames.shape
    film = np.full((h, f * (w + 1) - 1, c), 128, dtype=np.uint8)
    for i in range(f):
        film[:, i * (w + 1) : i * (w + 1) + w] = frames[i]
    return film


def run(recipe: Recipe, run_dir: Path, *, mode: str = "train", recipe_name: str = "") -> int:
    return run_trainer(
        DiffusionTrainer,
        recipe,
        run_dir,
        mode=mode,
        recipe_name=recipe_name,
        title=f"unirl diffusion run: {recipe_name}",
    )
