"""Mislabelled SFT data: a seeded fraction of captions replaced by random training captions.

Scraped image-text (and video-text) pairs are partly mislabelled. With noise p, SFT converges to a
policy that ignores the prompt about a fraction p of the time whatever the machine and wherever
SFT stops; only a reward that reads the sample against the prompt removes it. RL and evaluation
never see the noise. Shared by the shapes and moving-shapes worlds (``data.sft_caption_noise``).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

__all__ = ["SFT_CAPTION_NOISE_FIELD", "mislabel"]

SFT_CAPTION_NOISE_FIELD = Field(
    default=0.0,
    ge=0.0,
    lt=1.0,
    description="fraction of SFT examples whose caption is a random training caption instead of the "
    "sample's own (mislabelled data, as in scraped pairs); RL and evaluation never see it",
)


def mislabel(captions: list[str], pool: list[str], p: float, *, seed: int, step: int) -> list[str]:
    """Each caption independently (probability ``p``) replaced by a uniform draw from ``pool``.

    A pure function of ``(seed, step)``; ``p == 0`` returns the captions unchanged.
    """
    if p <= 0:
        return list(captions)
    rng = np.random.default_rng([seed, step, 0x5F7])
    n = len(captions)
    noisy = rng.random(n) < p
    picks = rng.integers(len(pool), size=n)
    return [pool[int(k)] if flip else c for c, flip, k in zip(captions, noisy, picks, strict=True)]
