"""PETrainer: the prompt enhancer on the shared lifecycle (see base.py).

An AR policy rewrites each user prompt (``samples_per_prompt`` rewrites a prompt); the diffusion
model renders every rewrite ``images_per_rewrite`` (M) times; the reward scores each image against
the ORIGINAL prompt (its canonical meaning, ``metadata.answer``, not the rewrite). Lineage
(``unirl.types.lineage``): each rewrite is a parent Sample holding the ``ar`` Part, each render a
child Sample (group id = the parent's id) holding a copy of the rewrite and its ``diffusion`` Part.
The parent is credited with the mean / max / min of its children's rewards; advantages per Part:
AR grouped by prompt, images grouped by AR sample.

Two sibling TrainStacks, each optional (``ar.rl`` / ``diffusion.rl`` null = frozen): the enhancer
alone, the renderer alone on enhanced prompts, or both, each with its own algorithm, backend
(optimizer, LR schedule), LR and update cadence. One checkpoint holds both stacks (atomic).
Evaluation renders held-out user prompts through the enhancer (greedy AR, ODE renderer) and, with
``eval_unenhanced``, straight from the raw prompts: the un-enhanced baseline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from unirl.apps.data import draw
from unirl.apps.launch import run_trainer
from unirl.apps.loop import PromptRecord, StopFlag, make_samples, signal_fraction
from unirl.apps.plots import sample_grid
from unirl.apps.progress import PhaseProgress
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.base import Trainer
from unirl.apps.trainers.checkpoints import StacksCheckpoint, drawing
from unirl.apps.trainers.pe_async import PERolloutSide, rewrite_and_render, split_batch
from unirl.apps.trainers.pe_config import ARStackRL, DiffusionStackRL, PERLPhase, Recipe
from unirl.apps.trainers.phases import RLPlan, ScheduledBackend, apply_phase_lr
from unirl.apps.trainers.prompt_reward import OriginalPromptReward
from unirl.apps.worlds.shapes_paraphrase import ShapesParaphraseSource
from unirl.reward.service import RewardService
from unirl.rollout.ar import ARPipeline
from unirl.rollout.engines import TrainsideEngine
from unirl.rollout.engines.composed import ComposedEngine
from unirl.rollout.models.base import EncodesImages
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.train.algorithms import ContextReference, DrawsOwnRNG, StageAlgorithm, UsesReference
from unirl.train.checkpoint import CheckpointFormat
from unirl.train.geometry import BatchGeometry
from unirl.train.stack import TrainStack
from unirl.train.step_gc import manual_gc
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
from unirl.types.lineage import credit_parents

__all__ = ["OriginalPromptReward", "PETrainer", "Recipe", "run"]

AR, DIFFUSION = "ar", "diffusion"


@dataclass
class Side:
    """One sibling stack: its backend, pipeline (replay), RL settings (None = frozen) and algorithm."""

    name: str
    backend: ScheduledBackend
    pipeline: ARPipeline | FlowMatchPipeline
    rl: ARStackRL | DiffusionStackRL | None
    algorithm: StageAlgorithm | None  # None exactly when rl is


class PETrainer(Trainer):
    stage = DIFFUSION  # what a PE run is judged on: the render, scored against the original prompt
    cfg: Recipe
    pipeline: FlowMatchPipeline
    data: ShapesParaphraseSource

    def __init__(self, recipe: Recipe, run_dir: RunDir) -> None:
        super().__init__(recipe, run_dir)
        a, d = recipe.ar, recipe.diffusion
        self.data = recipe.data.build()
        # the enhancer
        self.ar_bundle = a.model.model_copy(update={"device": str(self.device)}).build()
        self.ar_pipeline = ARPipeline(self.ar_bundle, a.sampling, stage=AR, prompt_template=a.prompt_template)
        self.ar_backend = a.backend.build(self.ar_bundle.model, device=self.device)
        self.ar_engine = TrainsideEngine(self.ar_pipeline, weight_version=lambda: self.ar_backend.global_step)
        # the renderer (self.backend / self.pipeline: the diffusion stack, as in DiffusionTrainer)
        self.bundle = d.model.build(self.device, recipe.seed)
        d_alg = d.rl.algorithm if d.rl is not None else None
        overrides = d_alg.sampling_overrides() if d_alg is not None else {}
        params = d.sampling.model_copy(update=overrides) if overrides else d.sampling
        self.pipeline = FlowMatchPipeline(
            self.bundle,
            stage=DIFFUSION,
            default_params=params,
            prompt_part=AR,
            record_old_means=d_alg is not None and d_alg.kind == "flow_dppo",
        )
        self.backend = d.backend.build(self.bundle.transformer, device=self.device)
        self.d_engine = TrainsideEngine(self.pipeline, weight_version=lambda: self.backend.global_step)
        # evaluation: ODE renders of the rewrites (the PE engine: ar -> diffusion) or of the raw prompts
        noise = params.noise.model_copy(update={"scope": "sample"})
        ode = params.model_copy(update={"eta": 0.0, "sde_strategy": "ode", "noise": noise})
        self.engine = ComposedEngine(
            [
                (AR, self.ar_engine),
                (
                    DIFFUSION,
                    TrainsideEngine(
                        FlowMatchPipeline(self.bundle, stage=DIFFUSION, default_params=ode, prompt_part=AR)
                    ),
                ),
            ]
        )
        self.raw_engine = TrainsideEngine(FlowMatchPipeline(self.bundle, stage=DIFFUSION, default_params=ode))
        self.unenhanced = False  # evaluate() on the raw user prompts (the un-enhanced baseline)
        self.oracle = False  # evaluate() on the canonical captions (the renderer's ceiling)
        self.reward = OriginalPromptReward(RewardService.from_config(recipe.reward))
        self.sides = {
            AR: self._side(AR, self.ar_backend, self.ar_pipeline, a.rl),
            DIFFUSION: self._side(DIFFUSION, self.backend, self.pipeline, d.rl),
        }
        self.algorithm = None  # each Side has its own
        self._sft_algorithms: dict[str, StageAlgorithm] = {}  # side -> its SFT algorithm (sft_side_algorithm)

    def _side(
        self,
        name: str,
        backend: ScheduledBackend,
        pipeline: ARPipeline | FlowMatchPipeline,
        rl: ARStackRL | DiffusionStackRL | None,
    ) -> Side:
        alg = rl.algorithm.build() if rl is not None else None
        if isinstance(alg, UsesReference) and rl is not None and rl.algorithm.needs_reference:
            alg.set_reference(ContextReference(pipeline, backend.reference_weights))
        return Side(name, backend, pipeline, rl, alg)

    # ---- SFT: the renderer's phase, then the enhancer's ---------------------------------------
    def sft(self, stop: StopFlag) -> None:
        plan = self.cfg.sft
        if plan is None:
            return
        t0 = time.time()
        phases = (
            (DIFFUSION, plan.diffusion, 0, plan.diffusion_steps),
            (AR, plan.ar, plan.diffusion_steps, plan.steps),
        )
        for name, phase, start, end in phases:
            if phase is None or self.sft_step >= end or stop.stop:
                continue
            side = self.sides[name]
            apply_phase_lr(side.backend, phase, self.sft_step - start)
            geometry = BatchGeometry(
                micro_batch_size=min(phase.micro_batch_size or phase.batch_size, phase.batch_size)
            )
            stack = TrainStack(side.backend, self.sft_side_algorithm(name), side.pipeline, geometry)
            with (
                PhaseProgress(f"sft {name}", end - self.sft_step) as bar,
                manual_gc(self.cfg.manual_gc) as gc,
            ):
                while self.sft_step < end and not stop.stop:
                    gc()
                    parts = self.sft_parts_of(name, phase.batch_size, self.sft_step - start)
                    m = stack.train_on(parts)
                    fault_point("sft", self.sft_step)
                    self.run.log(self.sft_step, {f"{name}/{k}": v for k, v in m.items()}, phase="sft")
                    bar.advance(loss=m.get("loss", float("nan")))
                    self.sft_step += 1
                    every = phase.checkpoint_every  # not after the last step: run_all saves the result
                    if every and (self.sft_step - start) % every == 0 and self.sft_step < plan.steps:
                        self.save()
        self._timed("sft", t0)

    def sft_side_algorithm(self, name: str) -> StageAlgorithm:
        """Side ``name``'s SFT algorithm, built once per process (a checkpoint saves its generator)."""
        if name not in self._sft_algorithms:
            phase = self.cfg.ar.sft if name == AR else self.cfg.diffusion.sft
            if phase is None:
                raise ValueError(f"{name}.sft is null: the {name} stack has no SFT phase")
            self._sft_algorithms[name] = phase.algorithm.build()
        return self._sft_algorithms[name]

    def drawing_algorithms(self) -> dict[str, DrawsOwnRNG]:
        """Each side's SFT and RL algorithm that draws from its own generator: ``sft-diffusion``
        (FlowSFT's t / noise), ``sft-ar``, ``rl-ar``, ``rl-diffusion``."""
        algs = {f"rl-{n}": side.algorithm for n, side in self.sides.items()}
        sft = self.cfg.sft
        phases = {DIFFUSION: sft.diffusion, AR: sft.ar} if sft is not None else {}
        algs |= {f"sft-{n}": self.sft_side_algorithm(n) for n, phase in phases.items() if phase is not None}
        return drawing(algs)

    def sft_parts_of(self, name: str, batch_size: int, step: int) -> list[Part]:
        if name == AR:
            eos = self.ar_bundle.eos_token_ids[0]
            parts = []
            for prompt, target in self.data.sft_pairs(batch_size, seed=self.cfg.seed, step=step):
                ids = self.ar_bundle.encode_prompt(self.cfg.ar.prompt_template.format(prompt=prompt))
                response = [*self.ar_bundle.tokenizer.encode(target, add_special_tokens=False), eos]
                seg = TextSegment(prompt_ids=ids, response_ids=response)
                parts.append(
                    Part(
                        name=AR,
                        segment=seg,
                        sampling_params=self.cfg.ar.sampling,
                        outputs=[TextPrimitive(text=target)],
                    )
                )
            return parts
        images, captions = self.data.sft_examples(batch_size, seed=self.cfg.seed, step=step)
        if not isinstance(self.bundle, EncodesImages):
            raise TypeError(f"diffusion.sft: {type(self.bundle).__name__} cannot encode images to latents")
        with torch.no_grad():
            x0 = self.bundle.encode_images(torch.from_numpy(images).to(self.device)).float().cpu()
        conds = self.bundle.encode_prompts(captions)
        return [
            Part.model_construct(
                name=DIFFUSION,
                segment=LatentTrajectory.model_construct(
                    kind="latent", latents=x[None], positions=[1], sigmas=[1.0, 0.0], sde_indices=[]
                ),
                conditions=c,
                outputs=[],
                status="completed",
            )
            for x, c in zip(x0, conds)
        ]

    # ---- RL: prompts -> rewrites -> renders -> reward -> credit -> advantages -> both stacks ----
    def collect(
        self,
        plan: RLPlan,
        train: list[PromptRecord],
        step: int,
        rollout: Callable[[list[Sample], int], list[Sample]] | None = None,
    ) -> tuple[list[Sample], dict[str, float]]:
        """One PE step: rewrites (parents) -> renders (children) by ``rollout`` (the async
        lifecycle's copies; default the trainer's own engines) -> rewards -> credit -> advantages.
        Returns the parents and the children (``train_parts`` takes each stack's Parts from them)."""
        if not isinstance(plan, PERLPhase):
            raise TypeError(f"PETrainer.collect needs the recipe's PERLPhase, got {plan!r}")
        phase = plan
        records = draw(train, phase.prompts_per_step, seed=self.cfg.seed, step=step)
        samples = make_samples(
            records,
            step=step,
            samples_per_prompt=phase.samples_per_prompt,
            split="train",
            dataset=self.data.name,
        )
        both = (rollout or self.two_stage)(samples, step)
        parents, children = split_batch(both)
        fault_point("sampled", step)
        self.reward.score_samples(children, DIFFUSION)
        ar_rewards = credit_parents(parents, children, AR, DIFFUSION, phase.credit)
        for side, samples in ((self.sides[AR], parents), (self.sides[DIFFUSION], children)):
            if side.rl is not None:
                compute_sample_advantages(samples, side.name, side.rl.advantage)
        fault_point("scored", step)
        exact = [s.part(AR).text.strip() == s.metadata.answer for s in parents]
        return parents + children, {
            "ar/reward_mean": float(np.mean(ar_rewards)),
            "ar/rewrite_exact": float(np.mean(exact)),
            "groups_with_signal": signal_fraction(parents, AR),
            "diffusion/groups_with_signal": signal_fraction(children, DIFFUSION),
        }

    def two_stage(self, samples: list[Sample], step: int) -> list[Sample]:
        """The trainer's own engines: ``rewrite_and_render``."""
        assert self.cfg.rl is not None
        return rewrite_and_render(
            self.ar_engine, self.d_engine, samples, step, self.cfg.rl.images_per_rewrite
        )

    def train_parts(self, samples: list[Sample]) -> list[Part]:
        """The enhancer's Parts (of the rewrites), then the renderer's (of the renders)."""
        parents, children = split_batch(samples)
        return [s.part(AR) for s in parents] + [s.part(DIFFUSION) for s in children]

    def rollout_side(self) -> PERolloutSide:
        """The async lifecycle's rollout side: copies of both stacks fed through verified mailboxes."""
        return PERolloutSide(self)

    def sft_algorithm(self) -> None:
        """No one SFT algorithm: each side has its own (``sft_side_algorithm``)."""
        return None

    def begin_phase(self, name: str, *, starting: bool = False) -> Callable[[list[Part]], dict[str, float]]:
        if name != "rl":
            raise ValueError(f"PETrainer.begin_phase({name!r}): its SFT runs in sft()")
        stacks: dict[str, TrainStack] = {}
        for side in self.sides.values():
            if side.rl is None or side.algorithm is None:
                continue  # frozen: samples, never steps
            if starting and side.rl.reset_optimizer:
                side.backend.reset_optimizer()
            if starting and self._reference(side) == "frozen_copy":
                side.backend.snapshot_reference()
            apply_phase_lr(side.backend, side.rl, self.rl_step)
            stacks[side.name] = TrainStack(side.backend, side.algorithm, side.pipeline, side.rl.geometry)
        return lambda parts: self.train_step(stacks, parts)

    def _reference(self, side: Side) -> str:
        stack = self.cfg.ar if side.name == AR else self.cfg.diffusion
        return stack.backend.reference

    def train_step(self, stacks: dict[str, TrainStack], parts: list[Part]) -> dict[str, float]:
        """Train each trainable stack whose cadence (``rl.every``) falls on this RL step on its Parts
        (``train_parts``: the rewrites' for the enhancer, the renders' for the renderer)."""
        m: dict[str, float] = {}
        loss = 0.0
        for name, stack in stacks.items():
            rl = self.sides[name].rl
            if rl is None or self.rl_step % rl.every:
                continue
            sm = stack.train_on([p for p in parts if p.name == name])
            loss += sm.get("loss", 0.0)
            m |= {f"{name}/{k}": v for k, v in sm.items()}
        return m | {"loss": loss}

    # ---- evaluation ---------------------------------------------------------------------------
    def eval_params(self) -> ARSamplingParams:
        return self.cfg.ar.eval_sampling or self.cfg.ar.sampling.model_copy(update={"top_k": 1})

    def sample_prompts(
        self, records: Sequence[PromptRecord], samples_per_prompt: int, params: SamplingParams
    ) -> list[Sample]:
        """Held-out prompts rendered through the enhancer (``params``: its sampling), or from the raw
        prompts while ``self.unenhanced``; the renderer samples with the ODE."""
        samples = make_samples(
            list(records), step=0, samples_per_prompt=samples_per_prompt, split="eval", dataset=self.data.name
        )
        if self.unenhanced:
            return self.raw_engine.generate(samples, rollout_step=0)
        if self.oracle:  # the canonical caption itself: the renderer's ceiling for a perfect rewrite
            for s in samples:
                s.inputs = [TextPrimitive(text=str(s.metadata.answer))]
            return self.raw_engine.generate(samples, rollout_step=0)
        for s in samples:
            s.ensure_part(AR).sampling_params = params
        return self.engine.generate(samples, rollout_step=0)

    def measure(
        self, records: Sequence[PromptRecord], samples_per_prompt: int
    ) -> tuple[list[Sample], list[Reward], dict[str, list[float]], dict[str, float]]:
        """The base measure, plus ``rewrite_exact``: the fraction of enhanced prompts that are the
        canonical caption (what the renderer was trained on), so a gain can be told apart from
        the rewrites it comes from."""
        samples, scored, outcomes, m = super().measure(records, samples_per_prompt)
        if not (self.unenhanced or self.oracle):
            exact = [s.part(AR).text.strip() == str(s.metadata.answer) for s in samples]
            m["rewrite_exact"] = float(np.mean(exact)) if exact else 0.0
        return samples, scored, outcomes, m

    def evaluate(self, name: str, *, step: int, grid: bool = False) -> dict[str, float]:
        m = super().evaluate(name, step=step, grid=grid)
        base = name in ("sft", "eval") or (name == "rl" and self.cfg.diffusion.rl is not None)
        if self.cfg.eval_unenhanced and base and not (self.unenhanced or self.oracle):
            for mode in ("unenhanced", "oracle"):
                setattr(self, mode, True)
                try:
                    super().evaluate(f"{name}_{mode}", step=step, grid=grid and mode == "unenhanced")
                finally:
                    setattr(self, mode, False)
        return m

    def save_grid(self, samples: list[Sample], rewards: list[float], path: Path) -> Path:
        imgs = [np.asarray(to_numpy(s.part(DIFFUSION).outputs[0].pixels)) for s in samples]
        labels = [
            f"{s.prompt} -> {s.part(AR).text.strip() if not self.unenhanced else '(raw)'} | r={r:.2f}"
            for s, r in zip(samples, rewards)
        ]
        return sample_grid(imgs, labels, path)

    def checkpoint_target(self) -> tuple[StacksCheckpoint, CheckpointFormat]:
        """Both stacks in one atomic checkpoint (gathered: ``StacksCheckpoint`` has no shards)."""
        return StacksCheckpoint({AR: self.ar_backend, DIFFUSION: self.backend}), "full"


def run(recipe: Recipe, run_dir: Path, *, mode: str = "train", recipe_name: str = "") -> int:
    return run_trainer(
        PETrainer,
        recipe,
        run_dir,
        mode=mode,
        recipe_name=recipe_name,
        title=f"unirl prompt-enhancer run: {recipe_name}",
    )
