"""Held-out evaluation, shared by every trainer: sample the eval prompts, score, log, draw a grid.

``Evaluation`` is mixed into ``base.Trainer``; a domain trainer overrides its hooks
(``eval_params``, ``save_grid``, ``sample_diversity``) or, to evaluate differently (PE: through the
enhancer and un-enhanced), ``sample_prompts`` / ``measure`` / ``evaluate``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from unirl.apps.data import PromptSource
from unirl.apps.evalstats import is_baseline, solved_by_prompt, summarize_scores
from unirl.apps.loop import PromptRecord, by_group, make_samples
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.components import DomainSteps, SampleScorer
from unirl.apps.trainers.phases import RunSettings
from unirl.rollout.engines import RolloutEngine
from unirl.types import Reward, Sample, SamplingParams

log = logging.getLogger("unirl")


class Evaluation:
    """The evaluation part of a trainer; reads the trainer attributes annotated here."""

    cfg: RunSettings
    run: RunDir
    stage: str
    engine: RolloutEngine
    reward: SampleScorer
    data: PromptSource
    steps: DomainSteps
    evals: dict[str, dict[str, float]]
    eval_steps: dict[str, int]
    eval_outcomes: dict[str, dict[str, list[float]]]
    grids: list[str]

    if TYPE_CHECKING:

        def _timed(self, name: str, t0: float) -> None: ...

    def eval_params(self) -> SamplingParams:
        """Sampling params for held-out evaluation."""
        raise NotImplementedError

    def save_grid(self, samples: list[Sample], rewards: list[float], path: Path) -> Path | None:
        return self.steps.save_grid(samples, rewards, path)

    def sample_diversity(self, samples: list[Sample]) -> float | None:
        """How different one prompt's samples are (mean over prompts: the eval's ``diversity``)."""
        return self.steps.sample_diversity(samples)

    def sample_prompts(
        self, records: Sequence[PromptRecord], samples_per_prompt: int, params: SamplingParams
    ) -> list[Sample]:
        """``samples_per_prompt`` samples of each record with the given sampling params (eval ids:
        the same records always start from the same initial noise)."""
        samples = make_samples(
            list(records), step=0, samples_per_prompt=samples_per_prompt, split="eval", dataset=self.data.name
        )
        for s in samples:
            s.ensure_part(self.stage).sampling_params = params
        return self.engine.generate(samples, rollout_step=0)

    def measure(
        self, records: Sequence[PromptRecord], samples_per_prompt: int
    ) -> tuple[list[Sample], list[Reward], dict[str, list[float]], dict[str, float]]:
        """Each record sampled ``samples_per_prompt`` times with the evaluation's sampler, scored:
        (samples, rewards, solved per prompt, metrics as ``summarize_scores``)."""
        samples = self.sample_prompts(records, samples_per_prompt, self.eval_params())
        scored = self.reward.score_samples(samples, self.stage)
        outcomes = solved_by_prompt(scored, samples, self.cfg.eval.success_threshold)
        return samples, scored, outcomes, summarize_scores(scored, outcomes)

    @torch.no_grad()
    def evaluate(self, name: str, *, step: int, grid: bool = False) -> dict[str, float]:
        """Held-out prompts, ``eval.samples_per_prompt`` each. Metrics: ``reward`` (mean),
        ``accuracy`` (the fraction of samples reaching ``success_threshold``: GenEval's accuracy,
        what RL is judged on) and ``pass_at_k`` (the fraction of prompts with at least one such
        sample among their k)."""
        ev = self.cfg.eval
        records = self.data.eval_records()[: ev.num_prompts]
        if not records:
            return {}
        t0 = time.time()
        samples, scored, outcomes, m = self.measure(records, ev.samples_per_prompt)
        per_prompt = [self.sample_diversity(g) for g in by_group(samples).values()]
        if per_prompt and None not in per_prompt:
            m["diversity"] = float(np.nanmean(np.asarray(per_prompt, dtype=float)))
        self.evals[name] = m
        self.eval_steps[name] = step
        self.eval_outcomes[name] = outcomes
        phase = "eval_baseline" if is_baseline(name) else "eval"
        self.run.log(step, {f"eval_{k}": v for k, v in m.items()}, phase=phase)
        log.info("eval %-8s reward=%.3f accuracy=%.1f%% pass@%d=%.1f%% (%d prompts)", name, m["reward"],
                 100 * m["accuracy"], ev.samples_per_prompt, 100 * m["pass_at_k"], len(outcomes))  # fmt: skip
        if grid and ev.grid_size:
            k = ev.grid_size
            path = self.save_grid(
                samples[:k], [r.total for r in scored[:k]], self.run.samples / f"{name}.png"
            )
            if path is not None:
                self.grids.append(str(path.relative_to(self.run.root)))
        self._timed("eval", t0)
        return m
