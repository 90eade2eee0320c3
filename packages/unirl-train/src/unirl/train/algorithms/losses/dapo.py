"""DAPO reward-side extras as pure functions: overlong shaping, truncation policy, dynamic sampling.

These act on rewards BEFORE advantages are computed (the trainer applies them); the DAPO loss
itself is GRPO with ``eps_low=0.2, eps_high=0.28`` and ``token-mean`` aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

TruncationPolicy = Literal["zero", "keep", "soft"]


def overlong_penalty(length: int, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO soft overlong punishment ``min(-(len - (L - B)) / B * factor, 0)``.

    0 up to ``L - B`` tokens, then linear down to ``-factor`` at ``len == L`` (not capped beyond L).
    """
    if buffer <= 0 or buffer > max_length:
        raise ValueError(f"overlong buffer must be in (0, max_length={max_length}], got {buffer}")
    return min(-(length - (max_length - buffer)) / buffer * factor, 0.0)


def shape_reward(
    reward: float,
    length: int,
    truncated: bool,
    policy: TruncationPolicy,
    *,
    max_length: int,
    buffer: int,
    factor: float = 1.0,
) -> float:
    """Reward after the truncation policy.

    - ``zero``: a truncated response gets reward 0, others keep theirs;
    - ``keep``: rewards unchanged;
    - ``soft``: every response gets ``reward + overlong_penalty(length)`` (DAPO: the penalty is by
      length, so truncated responses at ``len == L`` get the full ``-factor``).
    """
    if policy == "zero":
        return 0.0 if truncated else reward
    if policy == "keep":
        return reward
    if policy == "soft":
        return reward + overlong_penalty(length, max_length, buffer, factor)
    raise ValueError(f"unknown truncation policy {policy!r}; choose 'zero', 'keep' or 'soft'")


def group_has_signal(rewards: Sequence[float], atol: float = 0.0) -> bool:
    """DAPO dynamic sampling: keep a group only if its rewards are not all equal (within ``atol``)."""
    if len(rewards) < 2:
        return False
    finite = [r for r in rewards if math.isfinite(r)]
    if len(finite) != len(rewards):
        raise ValueError(f"non-finite reward in group: {list(rewards)}")
    return max(finite) - min(finite) > atol
