"""UnifiedTrainer: one backbone that thinks then draws, on the shared lifecycle (see base.py).

Each Sample gets two Parts from one model: ``ar`` (the plan: the model rewrites the user's terse
prompt as text tokens) and ``image`` (parent ``ar``: an SDE rollout of the image head conditioned on
the exact prompt + plan tokens). The checker scores the image against the ORIGINAL prompt's meaning
(``OriginalPromptReward``); that one reward is credited to both Parts, and each Part's advantage is
normalised within its prompt's group. One optimizer step trains both tracks
(``UnifiedModelTrainStack``): ``rl.ar.weight * grad L_ar + rl.image.weight * grad L_image``, each
loss over its own global totals.

SFT trains both tracks on (user prompt, canonical caption as the plan, a render of it). Evaluation
samples the plan greedily and draws with the ODE.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from unirl.apps.data import draw
from unirl.apps.launch import run_trainer
from unirl.apps.loop import PromptRecord, make_samples, signal_fraction
from unirl.apps.plots import sample_grid
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.base import Trainer
from unirl.apps.trainers.checkpoints import drawing
from unirl.apps.trainers.phases import RLPlan, apply_phase_lr
from unirl.apps.trainers.prompt_reward import OriginalPromptReward
from unirl.apps.trainers.unified_async import UnifiedRolloutSide
from unirl.apps.trainers.unified_config import Recipe, TinyUnifiedModelConfig, UnifiedRLPhase
from unirl.apps.worlds.shapes_paraphrase import ShapesParaphraseSource
from unirl.reward.service import RewardService
from unirl.rollout.engines import TrainsideEngine
from unirl.rollout.engines.composed import ComposedEngine
from unirl.rollout.unified import TinyUnifiedBundle, UnifiedImagePipeline, UnifiedTextPipeline
from unirl.train.algorithms import (
    AlgorithmConfig,
    ContextReference,
    DrawsOwnRNG,
    StageAlgorithm,
    UsesOldPolicy,
    UsesReference,
)
from unirl.train.geometry import BatchGeometry
from unirl.train.unified_stack import Track, UnifiedModelTrainStack
from unirl.types import (
    ARSamplingParams,
    LatentTrajectory,
    Part,
    Reward,
    Sample,
    SamplingParams,
    TextPrimitive,
    TextSegment,
    compute_sample_advantages,
    to_numpy,
)
from unirl.types.faults import fault_point

__all__ = ["Recipe", "UnifiedTrainer", "build_bundle", "run", "world_words"]

AR, IMAGE = "ar", "image"


def world_words(data: ShapesParaphraseSource) -> list[str]:
    """Every word of the data's prompts and captions, sorted: the closed vocabulary of the world."""
    recs = data.all_records()
    return sorted({w for r in recs for w in f"{r.prompt} {r.answer or ''}".lower().split()})


def build_bundle(
    cfg: TinyUnifiedModelConfig, words: list[str], image_size: int, seed: int
) -> TinyUnifiedBundle:
    if cfg.path is not None:
        return TinyUnifiedBundle.from_pretrained(cfg.path)
    sizes = cfg.model_dump(exclude={"kind", "path"})
    return TinyUnifiedBundle.tiny(words, seed=seed, image_size=image_size, **sizes)


class UnifiedTrainer(Trainer):
    stage = IMAGE  # what a run is judged on: the drawing, scored against the original prompt
    cfg: Recipe
    pipeline: UnifiedImagePipeline
    data: ShapesParaphraseSource

    def __init__(self, recipe: Recipe, run_dir: RunDir) -> None:
        super().__init__(recipe, run_dir)
        self.data = recipe.data.build()
        self.bundle = build_bundle(recipe.model, world_words(self.data), recipe.data.resolution, recipe.seed)
        self.bundle.to(self.device)
        self.backend = recipe.backend.build(self.bundle.model, device=self.device)
        version = lambda: self.backend.global_step  # noqa: E731
        image_alg = (
            recipe.rl.image.algorithm if recipe.rl is not None and recipe.rl.image is not None else None
        )
        overrides = image_alg.sampling_overrides() if image_alg is not None else {}
        params = recipe.image_sampling
        params = params.model_copy(update=overrides) if overrides else params
        self.text_pipeline = UnifiedTextPipeline(self.bundle, stage=AR, default_params=recipe.ar_sampling)
        self.pipeline = UnifiedImagePipeline(
            self.bundle,
            stage=IMAGE,
            text_part=AR,
            default_params=params,
            record_old_means=image_alg is not None and image_alg.kind == "flow_dppo",
        )
        # DiffusionNFT: the image track samples with its old policy (the backend's EMA); the text
        # track always samples with the live weights
        self.nft = image_alg is not None and image_alg.kind == "diffusion_nft"
        old_policy = self.backend.ema_weights if self.nft else None
        self.engine = ComposedEngine(
            [
                (AR, TrainsideEngine(self.text_pipeline, weight_version=version)),
                (IMAGE, TrainsideEngine(self.pipeline, weight_version=version, sampling_context=old_policy)),
            ]
        )
        noise = params.noise.model_copy(update={"scope": "sample"})
        ode = params.model_copy(update={"eta": 0.0, "sde_strategy": "ode", "noise": noise})
        self.eval_engine = ComposedEngine(
            [
                (AR, TrainsideEngine(self.text_pipeline, weight_version=version)),
                (
                    IMAGE,
                    TrainsideEngine(
                        UnifiedImagePipeline(self.bundle, default_params=ode), weight_version=version
                    ),
                ),
            ]
        )
        self.reward = OriginalPromptReward(RewardService.from_config(recipe.reward))
        self.algorithm = None  # each track has its own
        self._track_algs: dict[str, dict[str, StageAlgorithm]] = {}  # phase -> track -> algorithm
        self.rl_tracks: list[str] = []  # the tracks RL trains (begin_phase)

    # ---- SFT: both tracks on (prompt, canonical plan, render) ---------------------------------
    def sft_parts(self, batch_size: int, step: int) -> list[Part]:
        """``batch_size`` AR Parts (prompt -> canonical caption + EOS), then their image Parts
        (the caption's render, conditioned on the same prompt + plan tokens)."""
        b, seed = self.bundle, self.cfg.seed
        pairs = self.data.sft_pairs(batch_size, seed=seed, step=step)
        rng = np.random.default_rng([seed, step, 29])
        images = np.stack([self.data.world.example(caption, rng).image for _, caption in pairs])
        with torch.no_grad():
            x0 = b.encode_images(torch.from_numpy(images)).float().cpu()
        text, image = [], []
        for (prompt, caption), x in zip(pairs, x0):
            ids, plan = b.encode_prompt(prompt), [*b.encode_plan(caption), b.eos_token_id]
            seg = TextSegment(prompt_ids=ids, response_ids=plan)
            text.append(
                Part(
                    name=AR,
                    segment=seg,
                    sampling_params=self.cfg.ar_sampling,
                    outputs=[TextPrimitive(text=caption)],
                )
            )
            image.append(
                Part.model_construct(
                    name=IMAGE,
                    parent=AR,
                    segment=LatentTrajectory.model_construct(
                        kind="latent", latents=x[None], positions=[1], sigmas=[1.0, 0.0], sde_indices=[]
                    ),
                    conditions=b.context_conditions(ids, plan),
                    outputs=[],
                    status="completed",
                )
            )
        return text + image

    def sft_algorithm(self) -> None:
        """No one SFT algorithm: each track has its own (``track_algorithms``)."""
        return None

    def track_algorithms(self, phase: str) -> dict[str, StageAlgorithm]:
        """track -> its algorithm in phase ``phase`` ('sft', 'rl'), built once per process: a
        checkpoint saves the generators they draw from (``drawing_algorithms``)."""
        if phase not in self._track_algs:
            cfgs: dict[str, AlgorithmConfig]
            if phase == "sft":
                sft = self.cfg.sft
                cfgs = {AR: sft.ar, IMAGE: sft.image} if sft is not None else {}
            else:
                rl = self.cfg.rl
                tracks = {AR: rl.ar, IMAGE: rl.image} if rl is not None else {}
                cfgs = {n: t.algorithm for n, t in tracks.items() if t is not None}
            self._track_algs[phase] = {n: c.build() for n, c in cfgs.items()}
        return self._track_algs[phase]

    def drawing_algorithms(self) -> dict[str, DrawsOwnRNG]:
        """Each phase's track algorithm that draws from its own generator: ``sft-image``
        (FlowSFT), ``rl-image`` (DiffusionNFT's t / noise), ``sft-ar``, ``rl-ar``."""
        return drawing({f"{ph}-{n}": a for ph in ("sft", "rl") for n, a in self.track_algorithms(ph).items()})

    def begin_phase(self, name: str, *, starting: bool = False) -> Callable[[list[Part]], dict[str, float]]:
        if name not in ("sft", "rl"):
            raise ValueError(f"phase={name!r} is not one of 'sft', 'rl'")
        sft, phase = self.cfg.sft, self.cfg.rl
        if name == "sft":
            if sft is None:
                raise ValueError("UnifiedTrainer.begin_phase('sft'): the recipe has no `sft`")
            apply_phase_lr(self.backend, sft, self.sft_step)
            geometry = BatchGeometry(
                micro_batch_size=min(sft.micro_batch_size or sft.batch_size, sft.batch_size)
            )
            algs = self.track_algorithms("sft")
            tracks = [
                Track(AR, algs[AR], self.text_pipeline, sft.ar_weight),
                Track(IMAGE, algs[IMAGE], self.pipeline, sft.image_weight),
            ]
            return UnifiedModelTrainStack(self.backend, tracks, geometry).train_on
        if phase is None:
            raise ValueError("UnifiedTrainer.begin_phase('rl'): the recipe has no `rl`")
        if starting and phase.reset_optimizer:
            self.backend.reset_optimizer()
        if starting and self.cfg.backend.reference == "frozen_copy":
            self.backend.snapshot_reference()  # both tracks' KL / drift reference: the SFT result
        if starting and self.nft:
            self.backend.restart_ema()  # NFT's old policy starts at the SFT result
        apply_phase_lr(self.backend, phase, self.rl_step)
        algs = self.track_algorithms("rl")
        tracks = []
        for n, cfg, pipe in ((AR, phase.ar, self.text_pipeline), (IMAGE, phase.image, self.pipeline)):
            if cfg is None:
                continue
            alg = algs[n]
            if isinstance(alg, UsesReference) and cfg.algorithm.needs_reference:  # KL / drift penalty
                alg.set_reference(ContextReference(pipe, self.backend.reference_weights))
            if isinstance(alg, UsesOldPolicy):  # DiffusionNFT: the EMA is its old policy
                alg.set_old_policy(self.backend.ema_weights)
            tracks.append(Track(n, alg, pipe, cfg.weight))
        self.rl_tracks = [t.name for t in tracks]
        return UnifiedModelTrainStack(self.backend, tracks, phase.geometry).train_on

    # ---- RL: prompts -> think + draw -> reward -> credit both -> advantages -> one step ---------
    def collect(
        self,
        plan: RLPlan,
        train: list[PromptRecord],
        step: int,
        rollout: Callable[[list[Sample], int], list[Sample]] | None = None,
    ) -> tuple[list[Sample], dict[str, float]]:
        """One step's rollout (``rollout``: the async lifecycle's copy; default the trainer's own
        engine), scored and credited."""
        if not isinstance(plan, UnifiedRLPhase):
            raise TypeError(f"UnifiedTrainer.collect needs the recipe's UnifiedRLPhase, got {plan!r}")
        phase = plan
        records = draw(train, phase.prompts_per_step, seed=self.cfg.seed, step=step)
        samples = make_samples(
            records,
            step=step,
            samples_per_prompt=phase.samples_per_prompt,
            split="train",
            dataset=self.data.name,
        )
        samples = (rollout or self.rollout)(samples, step)
        fault_point("sampled", step)
        self.reward.score_samples(samples, IMAGE)
        credit_text_part(samples)
        for name in (AR, IMAGE):
            compute_sample_advantages(samples, name, phase.advantage)
        fault_point("scored", step)
        exact = [s.part(AR).text.strip() == s.metadata.answer for s in samples]
        return samples, {
            "groups_with_signal": signal_fraction(samples, IMAGE),
            "ar/plan_exact": float(np.mean(exact)),
        }

    def train_parts(self, samples: list[Sample]) -> list[Part]:
        """Both tracks' Parts of the batch (those RL trains), track by track."""
        return [s.part(n) for n in (AR, IMAGE) if n in self.rl_tracks for s in samples]

    def rollout_side(self) -> UnifiedRolloutSide:
        """The async lifecycle's rollout side: copies of the model (the text track's live weights,
        the image track's old policy), fed through verified mailboxes."""
        cfg, words = self.cfg, world_words(self.data)
        return UnifiedRolloutSide(self, lambda: build_bundle(cfg.model, words, cfg.data.resolution, cfg.seed))

    # ---- evaluation ---------------------------------------------------------------------------
    def eval_params(self) -> ARSamplingParams:
        return self.cfg.eval_ar_sampling or self.cfg.ar_sampling.model_copy(update={"top_k": 1})

    def sample_prompts(
        self, records: Sequence[PromptRecord], samples_per_prompt: int, params: SamplingParams
    ) -> list[Sample]:
        samples = make_samples(
            list(records), step=0, samples_per_prompt=samples_per_prompt, split="eval", dataset=self.data.name
        )
        for s in samples:
            s.ensure_part(AR).sampling_params = params
        return self.eval_engine.generate(samples, rollout_step=0)

    def save_grid(self, samples: list[Sample], rewards: list[float], path: Path) -> Path:
        imgs = [np.asarray(to_numpy(s.part(IMAGE).outputs[0].pixels)) for s in samples]
        labels = [f"{s.prompt} -> {s.part(AR).text} | r={r:.2f}" for s, r in zip(samples, rewards)]
        return sample_grid(imgs, labels, path)


def credit_text_part(samples: list[Sample]) -> None:
    """The plan is credited with its own image's reward (one image per plan: the mean of one)."""
    for s in samples:
        r = s.part(IMAGE).reward
        if r is None:
            raise ValueError(f"sample {s.id!r}: the image Part has no reward; score it first")
        s.part(AR).reward = Reward(total=r.total, components=dict(r.components))


def run(recipe: Recipe, run_dir: Path, *, mode: str = "train", recipe_name: str = "") -> int:
    return run_trainer(
        UnifiedTrainer,
        recipe,
        run_dir,
        mode=mode,
        recipe_name=recipe_name,
        title=f"unirl unified-model run: {recipe_name}",
    )
