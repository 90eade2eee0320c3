"""Rewards -> advantages, as pure numpy over a batch grouped by group id.

Conventions pinned here (REFERENCE_MATH.md, "Advantages"):
- ``group_zscore``: A = (r - mean_g) / (std_g + eps), std_g the POPULATION std of the group
  (ddof=0, as Flow-GRPO) unless ``std="unbiased"`` (ddof=1, as verl).
- ``batch_std``: A = (r - mean_g) / (std_batch + eps): group-centred, one batch-wide std.
- ``mean_only`` (Dr.GRPO): A = r - mean_g.
- ``rloo``: A = r - mean of the other members of the group.
- ``global``: A = (r - mean_batch) / (std_batch + eps): no grouping.
A group whose rewards are all equal, and a group of one, gets A = 0 (never NaN) in every grouped
mode. Groups may be ragged and in any order; ``group_size`` makes a fixed size mandatory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field

from unirl.types.base import SchemaModel

AdvantageMode = Literal["group_zscore", "batch_std", "mean_only", "rloo", "global"]


class AdvantageConfig(SchemaModel):
    """How rewards become advantages (see the module docstring for each mode)."""

    mode: AdvantageMode = "group_zscore"
    std: Literal["population", "unbiased"] = "population"
    eps: float = Field(default=1e-6, ge=0.0)
    clip: float | None = Field(default=None, gt=0.0, description="clip |A| to this value (e.g. 5)")
    group_size: int | None = Field(default=None, ge=1, description="if set, every group must have this size")


def _std(x: np.ndarray, unbiased: bool) -> float:
    if len(x) < 2:
        return 0.0
    return float(np.std(x, ddof=1 if unbiased else 0))


def compute_advantages(
    rewards: Sequence[float] | np.ndarray,
    group_ids: Sequence[str],
    config: AdvantageConfig | None = None,
    *,
    sample_ids: Sequence[str] | None = None,
) -> np.ndarray:
    """Advantages (float64 ``[N]``) for rewards ``[N]`` whose i-th entry belongs to ``group_ids[i]``."""
    cfg = config or AdvantageConfig()
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1 or len(r) != len(group_ids):
        raise ValueError(f"rewards has shape {list(r.shape)}; expected [{len(group_ids)}] (one per group id)")
    bad = np.flatnonzero(~np.isfinite(r))
    if len(bad):
        i = int(bad[0])
        who = sample_ids[i] if sample_ids is not None else f"index {i}"
        raise ValueError(f"reward of sample {who} is {r[i]}; rewards must be finite (check the scorer)")
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    if cfg.group_size is not None:
        wrong = {g: len(ix) for g, ix in groups.items() if len(ix) != cfg.group_size}
        if wrong:
            g, n = next(iter(wrong.items()))
            raise ValueError(
                f"group {g!r} has {n} samples; advantage.group_size={cfg.group_size} "
                f"({len(wrong)} group(s) differ). Drop incomplete groups or unset group_size"
            )
    unbiased = cfg.std == "unbiased"
    adv = np.zeros_like(r)
    if cfg.mode == "global":
        std = _std(r, unbiased)
        if std > 0.0:
            adv = (r - r.mean()) / (std + cfg.eps)
    else:
        batch_std = _std(r, unbiased)
        for ix in groups.values():
            x = r[ix]
            if len(x) < 2 or np.all(x == x[0]):
                continue  # singleton or zero-variance group: no signal, A = 0
            centred = x - x.mean()
            if cfg.mode == "group_zscore":
                adv[ix] = centred / (_std(x, unbiased) + cfg.eps)
            elif cfg.mode == "batch_std":
                adv[ix] = centred / (batch_std + cfg.eps)
            elif cfg.mode == "mean_only":
                adv[ix] = centred
            else:  # rloo: r_i - (sum - r_i)/(n-1) = n/(n-1) (r_i - mean)
                adv[ix] = centred * len(x) / (len(x) - 1)
    if cfg.clip is not None:
        adv = np.clip(adv, -cfg.clip, cfg.clip)
    assert all(math.isfinite(a) for a in adv)  # internal invariant, not input validation
    return adv
