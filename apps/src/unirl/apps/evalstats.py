"""Uncertainty of held-out evaluations: pure functions over per-sample outcomes.

A held-out evaluation scores ``samples_per_prompt`` samples of each of a few prompts. Samples of
one prompt are correlated (one caption is easy, another hard), so an interval that treats all
samples as independent is too narrow. The gain of one stage over another is measured on the SAME
prompts and initial noise, so it is a paired comparison: ``paired_bootstrap`` resamples whole
prompts, with replacement, and recomputes both stages' means on each resample.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from unirl.types import Reward, Sample

Outcomes = Mapping[str, Sequence[float]]
"""prompt (group) id -> that prompt's per-sample outcomes (1.0 solved, 0.0 not; or a score)."""


def made_by_rl(name: str) -> bool:
    """Whether the evaluation ``name`` is a point of RL's curve: ``rl@N`` (during RL), ``rl`` (the
    end) or ``eval`` (a standalone evaluation); the others (``init``, ``sft`` and the baselines
    beside a stage, e.g. the prompt enhancer's ``sft_unenhanced``) are levels."""
    return re.fullmatch(r"rl(@\d+)?|eval", name) is not None


def is_baseline(name: str) -> bool:
    """A comparison evaluated beside a stage (``<stage>_<mode>``), not a stage of the run itself:
    logged as phase ``eval_baseline`` so RL's curve (phase ``eval``) holds only the run's own stages."""
    return name not in ("init", "sft") and not made_by_rl(name)


def bootstrap_interval(
    outcomes: Outcomes, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Interval of one evaluation's sample mean, resampling whole prompts (each brings all its
    samples): wider than a binomial interval over the samples when a prompt's samples agree.

    Worked example: prompts {a: [1, 1], b: [0, 0]} -> a resample is aa (1.0), bb (0.0) or ab
    (0.5), so the 95% interval is (0.0, 1.0); a binomial one over the 4 samples would be ~(0.15, 0.85)."""
    if not outcomes:
        return 0.0, 1.0
    sums = np.array([float(np.sum(v)) for v in outcomes.values()])
    ns = np.array([len(v) for v in outcomes.values()], dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(sums), size=(n_boot, len(sums)))
    means = sums[idx].sum(1) / ns[idx].sum(1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def paired_bootstrap(
    before: Outcomes, after: Outcomes, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(after - before, low, high): the difference of the sample means and its bootstrap interval,
    resampling the prompts both evaluations share (each resampled prompt brings all its samples).

    Only prompts present in both count. With one shared prompt the interval is the point."""
    keys = sorted(set(before) & set(after))
    if not keys:
        raise ValueError("paired_bootstrap: the two evaluations share no prompt")
    b_sum = np.array([float(np.sum(before[k])) for k in keys])
    b_n = np.array([len(before[k]) for k in keys], dtype=float)
    a_sum = np.array([float(np.sum(after[k])) for k in keys])
    a_n = np.array([len(after[k]) for k in keys], dtype=float)
    diff = a_sum.sum() / a_n.sum() - b_sum.sum() / b_n.sum()
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(keys), size=(n_boot, len(keys)))
    diffs = a_sum[idx].sum(1) / a_n[idx].sum(1) - b_sum[idx].sum(1) / b_n[idx].sum(1)
    lo, hi = np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2])
    return float(diff), float(lo), float(hi)


def pairwise_diversity(images: Sequence[np.ndarray]) -> float:
    """Mean absolute pixel difference (in [0, 1]) over all pairs of one prompt's uint8 images: 0 when
    every sample is the same image (a collapsed policy), ~0.2-0.4 for unrelated layouts."""
    if len(images) < 2:
        return float("nan")
    x = np.stack([np.asarray(i, dtype=np.float32) / 255.0 for i in images]).reshape(len(images), -1)
    total, pairs = 0.0, 0
    for i in range(len(x)):
        d = np.abs(x[i + 1 :] - x[i]).mean(axis=1)
        total += float(d.sum())
        pairs += len(d)
    return total / pairs


def distinct_fraction(texts: Sequence[str]) -> float:
    """Distinct responses / responses for one prompt: 1/n when all n are the same, 1.0 when all differ."""
    return len(set(texts)) / len(texts) if texts else float("nan")


def solved_by_prompt(
    scored: Sequence[Reward], samples: Sequence[Sample], threshold: float
) -> dict[str, list[float]]:
    """prompt (group) id -> 1.0 / 0.0 per sample: total reward >= ``threshold``."""
    out: dict[str, list[float]] = {}
    for s, r in zip(samples, scored):
        out.setdefault(s.group_id, []).append(float(r.total >= threshold))
    return out


def summarize_scores(scored: Sequence[Reward], solved: dict[str, list[float]]) -> dict[str, float]:
    """An evaluation's metrics: ``reward`` (mean), ``accuracy`` (the fraction of samples solved, from
    ``solved_by_prompt``), ``pass_at_k`` (prompts with one solved sample) and each check's rate."""
    m = {
        "reward": float(np.mean([r.total for r in scored])),
        "accuracy": float(np.mean([v for vs in solved.values() for v in vs])),
        "pass_at_k": float(np.mean([max(o) for o in solved.values()])),
    }
    return m | check_rates(scored)


def check_rates(rewards: Sequence[Reward]) -> dict[str, float]:
    """Mean of each scorer's own components (``name/key``, e.g. ``geneval/count``) over the samples
    that have it: the per-check breakdown of an evaluation (a relation check exists only for
    relation prompts, so it is averaged over those)."""
    values: dict[str, list[float]] = {}
    for r in rewards:
        for k, v in r.components.items():
            if "/" in k:
                values.setdefault(k, []).append(float(v))
    return {k: float(np.mean(v)) for k, v in sorted(values.items())}
