"""JPEG (in)compressibility: the classic weight-free image reward (DDPO, Black et al. 2023).

The reward is the size of the image saved as JPEG at a fixed quality, in kB (1 kB = 1000 bytes,
as in the DDPO reference code). Incompressibility rewards larger files (+size), compressibility
smaller ones (-size). Deterministic for a given Pillow/libjpeg build; `version` names both.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Literal

import numpy as np
import PIL
from PIL import Image

from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs


def jpeg_size_kb(pixels: np.ndarray, quality: int = 95) -> float:
    """Size in kB (1000 bytes) of a uint8 [H, W, 3] image saved as JPEG at `quality`."""
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
    return buf.tell() / 1000.0


class JpegScorer:
    """`direction="incompressibility"`: total = +size_kb; `"compressibility"`: total = -size_kb."""

    modality: Modality = "image"

    def __init__(
        self,
        direction: Literal["compressibility", "incompressibility"] = "incompressibility",
        quality: int = 95,
    ) -> None:
        if direction not in ("compressibility", "incompressibility"):
            raise ValueError(f"direction must be 'compressibility' or 'incompressibility', got {direction!r}")
        if not 1 <= quality <= 100:
            raise ValueError(f"quality must be in [1, 100], got {quality}")
        self.direction = direction
        self.quality = quality
        self.name = f"jpeg_{direction}"
        self.version = f"1+q{quality}+pillow{PIL.__version__}"
        self.output_range = (0.0, float("inf")) if direction == "incompressibility" else (float("-inf"), 0.0)

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        sign = 1.0 if self.direction == "incompressibility" else -1.0
        out = []
        for item in items:
            assert item.image is not None  # checked above
            size = jpeg_size_kb(item.image, self.quality)
            out.append(ScoreResult(total=sign * size, components={"size_kb": size}))
        return out
