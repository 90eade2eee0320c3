"""The lifecycle every domain trainer shares: init eval -> SFT -> eval -> RL -> eval -> report.

A domain trainer (diffusion, ar) builds its bundle, pipeline, backend, engine, reward and data in
``__init__`` and supplies the few domain steps: ``sft_parts``, ``eval_params`` and ``save_grid``.
The RL step itself reads top to bottom: prompts -> rollout -> reward -> advantages -> train.
Held-out evaluation is in ``evaluation.py``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import numpy as np
import torch

from unirl.apps.data import PromptSource, draw
from unirl.apps.loop import (
    PromptRecord,
    StopFlag,
    by_group,
    has_signal,
    latest_checkpoint,
    make_samples,
    pick_device,
)
from unirl.apps.progress import PhaseProgress
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.ar_config import ARSFTPhase
from unirl.apps.trainers.checkpoints import drawing, restore_run, run_extra
from unirl.apps.trainers.components import DomainSteps, NoSteps, SampleScorer
from unirl.apps.trainers.diffusion_config import DiffusionSFTPhase
from unirl.apps.trainers.evaluation import Evaluation
from unirl.apps.trainers.phases import RLPlan, RunSettings, SFTStopConfig, apply_phase_lr, rl_phase, sft_phase
from unirl.rollout.engines import RolloutEngine
from unirl.rollout.pipelines import Pipeline
from unirl.train.algorithms import DrawsOwnRNG, StageAlgorithm
from unirl.train.checkpoint import Checkpointable, CheckpointFormat, load_checkpoint, save_checkpoint
from unirl.train.geometry import BatchGeometry
from unirl.train.stack import TrainStack
from unirl.train.step_gc import manual_gc
from unirl.types import Part, Sample, compute_sample_advantages
from unirl.types.faults import fault_point

if TYPE_CHECKING:
    from unirl.apps.asynchronous.buffer import BufferState
    from unirl.apps.asynchronous.source import AsyncSource, RolloutSide
    from unirl.apps.trainers.phases import ScheduledBackend

log = logging.getLogger("unirl")
SFT_PROBE_SEED = 104_729
"""Seed of the fixed training-prompt subset `sft.stop` probes (independent of the run's seed)."""


class Trainer(Evaluation):
    """Shared controller; subclasses set the attributes listed in ``__init__``. Held-out
    evaluation (``evaluate`` and its hooks) is in ``evaluation.Evaluation``."""

    cfg: RunSettings  # each domain trainer narrows it to its own Recipe
    stage: str
    backend: ScheduledBackend
    pipeline: Pipeline  # the domain's pipeline (FlowMatchPipeline, ARPipeline, ...): sampling + replay
    engine: RolloutEngine
    reward: SampleScorer
    data: PromptSource
    algorithm: StageAlgorithm | None  # None: the recipe has no RL phase (or, PE, one per side)
    steps: DomainSteps = NoSteps()
    """The domain's model-free steps (``make_steps``)."""

    def __init__(self, recipe: RunSettings, run_dir: RunDir) -> None:
        self.cfg, self.run = recipe, run_dir
        if recipe.threads:
            torch.set_num_threads(recipe.threads)
        torch.manual_seed(recipe.seed)
        random.seed(recipe.seed)  # the global RNGs too: a resumed run restores them (run_state)
        np.random.seed(recipe.seed)
        self.device = pick_device(recipe.device)
        self.rl_step = 0
        self.sft_step = 0  # the data cursor: SFT and RL batches are pure functions of (seed, step)
        self.stack_phase: str | None = None  # the phase of the last make_stack ("sft", "rl")
        # `sft.stop` reached its level: a resumed run goes on to RL (a run that ended at `sft.steps`
        # instead continues SFT when started again with more steps)
        self.sft_done = False
        self.evals: dict[str, dict[str, float]] = {}
        self.eval_steps: dict[str, int] = {}  # evaluation name -> the RL step it ran at
        self.eval_outcomes: dict[str, dict[str, list[float]]] = {}  # name -> prompt -> solved per sample
        self.timings: dict[str, float] = {}
        self.grids: list[str] = []
        self.rl_started: float | None = None  # while RL runs: when it (re)started
        self.checkpoint_rows: int | None = 0  # metrics rows the checkpoint resumed from had logged
        self.async_source: AsyncSource | None = None  # the async lifecycle's rollout thread + buffer
        self.async_state: tuple[BufferState, bytes] | None = None  # its buffer, from a checkpoint
        self._sft_algorithm: StageAlgorithm | None = None

    # ---- domain hooks -------------------------------------------------------------------------
    def sft_parts(self, batch_size: int, step: int) -> list[Part]:
        raise NotImplementedError

    @classmethod
    def make_steps(cls, recipe: RunSettings, algorithm: object) -> DomainSteps:
        """The domain's model-free steps (``self.steps``; the Ray controller builds its own)."""
        return NoSteps()

    def rollout_side(self) -> RolloutSide:
        """The async lifecycle's rollout side (``unirl.apps.asynchronous.RolloutSide``): here a
        rollout copy of the policy in this process; the Ray layout's rollout workers there."""
        from unirl.apps.asynchronous.source import LocalRolloutSide

        return LocalRolloutSide(self)

    def rollout_copy(self) -> tuple[Pipeline, torch.nn.Module]:
        """(pipeline, trainable module) of a second, rollout-only copy of the policy: the async
        lifecycle's rollout thread samples with it while the trainer trains the original."""
        from unirl.apps.distributed.workers import rollout_module

        with torch.random.fork_rng(devices=[]):  # building it must not move the run's RNG
            _, pipeline, module = rollout_module(self.cfg, self.stage, self.device)
        return pipeline, module

    def shape_rewards(self, parts: list[Part]) -> None:
        """Reward shaping before advantages (e.g. DAPO's overlong penalty); none by default."""
        self.steps.shape_rewards(parts)

    @property
    def ema_rollout(self) -> bool:  # DiffusionNFT samples with its EMA (old) policy
        return False

    def rollout_weights(self) -> AbstractContextManager[None]:
        """Within it the backend's module holds the weights rollout samples with (EMA or policy): the
        one place that decides it, for trainside sampling, every sync and the async publication.

        The EMA only once RL has begun (``ema_rollout``: it is RL's old policy, restarted at the SFT
        result): SFT's probes and its evaluation sample with the policy RL starts from, so the SFT
        row of the report is that policy and the weights at a given optimizer step are one set
        (a weight sync keyed by the step stays correct across the SFT -> RL boundary)."""
        in_rl = self.stack_phase == "rl" or self.rl_step > 0
        return self.backend.ema_weights() if self.ema_rollout and in_rl else nullcontext()

    # ---- phases -------------------------------------------------------------------------------
    def _timed(self, name: str, t0: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + time.time() - t0

    def make_stack(self, name: str, dp_size: int = 1, *, starting: bool = False) -> TrainStack:
        """The TrainStack of phase ``name`` ("sft" or "rl"), with the phase's learning rate set.

        ``dp_size``: data-parallel ranks sharing each batch (SFT micro-batches are per rank).
        ``starting``: the phase starts here (not resumed mid-way). RL then drops the optimizer state
        (``rl.reset_optimizer``) and, with ``backend.reference=frozen_copy``, takes the policy it starts
        from (the SFT result) as its KL reference; with ``backend.ema`` its EMA restarts there, decay
        ramp included (DiffusionNFT's old policy starts on-policy). A resumed RL phase keeps all three."""
        if name not in ("sft", "rl"):
            raise ValueError(f"phase={name!r} is not one of 'sft', 'rl'")
        self.stack_phase = name
        if name == "sft":
            sft = sft_phase(self.cfg)
            apply_phase_lr(self.backend, sft, self.sft_step)
            per_rank = sft.batch_size // dp_size
            geometry = BatchGeometry(micro_batch_size=min(sft.micro_batch_size or sft.batch_size, per_rank))
            algorithm = self.sft_algorithm()
            if algorithm is None:
                raise ValueError(f"{type(self).__name__}: phase 'sft' has no algorithm")
            return TrainStack(self.backend, algorithm, self.pipeline, geometry)
        rl, backend = rl_phase(self.cfg.rl), self.cfg.backend_config()
        if starting and rl.reset_optimizer:
            self.backend.reset_optimizer()
        if starting and backend is not None and backend.reference == "frozen_copy":
            self.backend.snapshot_reference()
        if starting and backend is not None and backend.ema is not None:
            self.backend.restart_ema()  # RL's EMA (NFT's old policy) starts at the SFT result
        apply_phase_lr(self.backend, rl, self.rl_step)
        if self.algorithm is None:
            raise ValueError(f"{type(self).__name__}: phase 'rl' has no algorithm (the recipe has no `rl`)")
        return TrainStack(self.backend, self.algorithm, self.pipeline, rl.geometry)

    def sft_algorithm(self) -> StageAlgorithm | None:
        """The SFT phase's StageAlgorithm, built once per process: a checkpoint saves (and a resume
        restores) its generator, e.g. FlowSFT's t / noise draws (``checkpoints.run_extra``)."""
        sft = self.cfg.sft
        if self._sft_algorithm is None and isinstance(sft, ARSFTPhase | DiffusionSFTPhase):
            self._sft_algorithm = sft.algorithm.build()
        return self._sft_algorithm

    def drawing_algorithms(self) -> dict[str, DrawsOwnRNG]:
        """name -> each algorithm of this process that draws from its own generator
        (``DrawsOwnRNG``), each built once: a checkpoint saves their states and a resume restores
        them (``checkpoints.algorithm_rng_files``). Here the SFT and RL phases' (``sft``, ``rl``)."""
        return drawing({"sft": self.sft_algorithm(), "rl": self.algorithm})

    def begin_phase(self, name: str, *, starting: bool = False) -> Callable[[list[Part]], dict[str, float]]:
        """The train step (parts -> metrics) of phase ``name``; a multi-worker layout overrides it."""
        return self.make_stack(name, starting=starting).train_on

    def after_train_step(self) -> dict[str, float]:
        """After each RL optimizer step (a dedicated rollout engine syncs weights here); extra metrics."""
        return {}

    def after_phase(self, name: str) -> None:
        """After a phase ends."""

    def sft(self, stop: StopFlag) -> None:
        if self.cfg.sft is None or self.cfg.sft.steps == 0:
            return
        phase = sft_phase(self.cfg)
        train = self.begin_phase("sft")
        t0 = time.time()
        with PhaseProgress("sft", phase.steps - self.sft_step) as bar, manual_gc(self.cfg.manual_gc) as gc:
            while self.sft_step < phase.steps and not stop.stop:
                gc()  # what the last step left (unirl.train.step_gc)
                step = self.sft_step
                m = train(self.sft_parts(phase.batch_size, step))
                fault_point("sft", step)
                self.run.log(step, m, phase="sft")
                bar.advance(loss=m.get("loss", float("nan")))
                self.sft_step += 1
                if phase.stop is not None and self._sft_level_reached(phase.stop):
                    break
                every = phase.checkpoint_every
                # not after the last step: run_all saves the SFT result after its evaluation
                if every and self.sft_step % every == 0 and self.sft_step < phase.steps:
                    self.save()
        self._timed("sft", t0)
        self.after_phase("sft")

    def _sft_level_reached(self, stop: SFTStopConfig) -> bool:
        """`sft.stop`: probe the training prompts every `stop.every` steps; True (and SFT is done)
        once the metric reaches `stop.at_least`."""
        if self.sft_step < stop.min_steps or self.sft_step % stop.every:
            return False
        # one fixed subset of the training prompts for every run and seed: the level means the same
        records = draw(self.data.train_records(), stop.num_prompts, seed=SFT_PROBE_SEED, step=0)
        *_, m = self.measure(records, stop.samples_per_prompt)
        if stop.metric not in m:
            raise ValueError(f"sft.stop.metric={stop.metric!r} is not measured; measured: {sorted(m)}")
        self.run.log(self.sft_step, {f"probe_{k}": v for k, v in m.items()}, phase="sft_probe")
        if m[stop.metric] < stop.at_least:
            return False
        log.info("sft: %s=%.3f >= %.3f on training prompts at step %d: SFT done", stop.metric,
                 m[stop.metric], stop.at_least, self.sft_step)  # fmt: skip
        self.sft_done = True
        return True

    def rollout(self, samples: list[Sample], step: int) -> list[Sample]:
        with self.rollout_weights():
            return self.engine.generate(samples, rollout_step=step)

    def rl(self, stop: StopFlag) -> None:
        phase = self.cfg.rl
        if phase is None or phase.steps == 0 or self.rl_step >= phase.steps:
            return
        # a fresh optimizer / KL reference only when RL starts; a resumed run keeps its checkpointed ones
        train_step = self.begin_phase("rl", starting=self.rl_step == 0)
        train = self.data.train_records()
        if phase.lifecycle == "async":  # a rollout thread fills a buffer; see unirl.apps.asynchronous
            from unirl.apps.asynchronous.source import AsyncSource

            self.async_source = AsyncSource(self, phase, train, self.async_state, self.rollout_side())
        t0 = time.time()
        try:
            with PhaseProgress("rl", phase.steps - self.rl_step) as bar, manual_gc(self.cfg.manual_gc) as gc:
                while self.rl_step < phase.steps and not stop.stop:
                    gc()
                    step = self.rl_step
                    src = self.async_source
                    samples, extra = src.next(step) if src else self.collect(phase, train, step)
                    fault_point("train", step)
                    m = train_step(self.train_parts(samples))
                    m |= self.after_train_step()
                    fault_point("trained", step)
                    if src:
                        src.publish(step + 1)
                    # the Parts the run is judged on (a PE batch also holds the rewrites, which have none)
                    rewards = [p.reward.total for s in samples for p in s.parts if p.name == self.stage]
                    m |= {
                        "reward_mean": float(np.mean(rewards)),
                        "reward_std": float(np.std(rewards)),
                        **extra,
                    }
                    self.run.log(step, m, phase="rl")
                    bar.advance(reward=m["reward_mean"], loss=m.get("loss", float("nan")))
                    self.rl_step += 1
                    if (
                        self.cfg.eval.every
                        and self.rl_step % self.cfg.eval.every == 0
                        and self.rl_step < phase.steps
                    ):
                        with src.borrowed() if src else nullcontext():
                            self.evaluate(f"rl@{self.rl_step}", step=self.rl_step)
                    if self.cfg.checkpoint_every and self.rl_step % self.cfg.checkpoint_every == 0:
                        self.save()
        finally:
            if self.async_source is not None:
                self.async_source.close()
        self._timed("rl", t0)

    def train_parts(self, samples: list[Sample]) -> list[Part]:
        """What an RL step trains on from its batch: each Sample's ``stage`` Part (a trainer that
        trains several Parts of a Sample, the unified model's two tracks, returns them all)."""
        return [s.part(self.stage) for s in samples]

    def collect(
        self,
        plan: RLPlan,
        train: list[PromptRecord],
        step: int,
        rollout: Callable[[list[Sample], int], list[Sample]] | None = None,
    ) -> tuple[list[Sample], dict[str, float]]:
        """prompts -> rollout -> reward (+ shaping) -> advantages, for one RL step.

        ``rollout``: who samples (default ``self.rollout``; the async lifecycle's rollout copy).

        With dynamic sampling, groups whose rewards are all equal carry no signal: they are
        dropped and refilled by extra rollout rounds (at most ``max_extra_rollouts``); if still
        short, dropped groups fill the batch so its size, and so the batch geometry, stays fixed."""
        phase = rl_phase(plan)
        n, ds = phase.prompts_per_step, phase.dynamic_sampling
        kept: list[list[Sample]] = []
        dropped: list[list[Sample]] = []
        rounds = signal = 0
        while True:
            records = draw(train, n, seed=self.cfg.seed + 7919 * rounds, step=step)
            batch = make_samples(
                records, step=step, samples_per_prompt=phase.samples_per_prompt, split="train",
                dataset=self.data.name, tag=f"r{rounds}" if rounds else "",
            )  # fmt: skip
            batch = (rollout or self.rollout)(batch, step)
            fault_point("sampled", step)
            self.reward.score_samples(batch, self.stage)
            self.shape_rewards([s.part(self.stage) for s in batch])
            for g in by_group(batch).values():
                useful = has_signal(g, self.stage)
                if rounds == 0:
                    signal += useful
                (kept if ds is None or useful else dropped).append(g)
            if ds is None or len(kept) >= n or rounds >= ds.max_extra_rollouts:
                break
            rounds += 1
        chosen = (kept + dropped)[:n]
        samples = [s for g in chosen for s in g]
        compute_sample_advantages(samples, self.stage, phase.advantage)
        fault_point("scored", step)
        # groups_with_signal: of the first round's groups (before any refill), those whose rewards differ
        extra = {"groups_with_signal": signal / n}
        if ds is not None:
            extra["extra_rollouts"] = float(rounds)
            extra["batch_groups_with_signal"] = float(min(len(kept), n)) / n
        return samples, extra

    # ---- checkpoints --------------------------------------------------------------------------
    def checkpoint_target(self) -> tuple[Checkpointable, CheckpointFormat]:
        """(what holds the weights and optimizer state, checkpoint format) of this trainer."""
        return self.backend, self.cfg.checkpoint_format

    def save(self) -> None:
        extra, files = run_extra(self)
        target, fmt = self.checkpoint_target()
        save_checkpoint(self.run.checkpoints / "latest", target, extra=extra, format=fmt, files=files)

    def resume(self) -> bool:
        ckpt = latest_checkpoint(self.run.root)
        if ckpt is None:
            return False
        log.info("resuming from %s", ckpt)
        restore_run(self, ckpt, load_checkpoint(ckpt, self.checkpoint_target()[0]))
        return True

    # ---- the whole run ------------------------------------------------------------------------
    def run_all(self, mode: str, stop: StopFlag) -> None:
        resumed = self.resume()
        if mode != "eval" and self.checkpoint_rows is not None:
            # the steps and evaluations logged after the checkpoint run (and are logged) again
            dropped = self.run.truncate(self.checkpoint_rows)
            if dropped:
                log.info("dropped %d metrics rows logged after the checkpoint", dropped)
        if mode == "eval":
            self.evaluate("eval", step=self.rl_step, grid=True)
            return
        sft_steps = self.cfg.sft.steps if self.cfg.sft is not None else 0
        if self.sft_step < sft_steps and not self.sft_done:  # a fresh run, or one stopped during SFT
            if self.sft_step == 0:
                self.evaluate("init", step=0)
            self.sft(stop)
            if not stop.stop:
                self.evaluate("sft", step=0, grid=True)
                if mode == "train":
                    self.save()  # the SFT result: RL killed before its first checkpoint resumes from here
        elif not resumed:
            self.evaluate("init", step=0, grid=True)
        if mode == "train" and not stop.stop:
            self.rl_started = time.time()
            try:
                self.rl(stop)
            finally:
                self.rl_started = None
            if self.cfg.rl is not None and self.cfg.rl.steps:
                self.evaluate("rl", step=self.rl_step, grid=True)
        self.save()
