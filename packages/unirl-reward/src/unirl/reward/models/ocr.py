"""OCR text match: read the image, compare with the text quoted in the prompt.

total = max(0, 1 - lev(read, target) / len(target)) after lower-casing and dropping
whitespace (the text-rendering reward used by Flow-GRPO), in [0, 1]. The target is the
first "double-quoted" (or 'single-quoted', or “curly-quoted”) span of the prompt. A prompt
without quoted text is a caller error (ValueError): there is nothing to match.

The OCR engine is a protocol; `TrOcrEngine` runs transformers' VisionEncoderDecoderModel
(TrOCR) from a local folder. (PyPI OCR packages such as easyocr/rapidocr fetch detector
weights at first use, so they are not usable offline.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from unirl.reward.models._extras import require
from unirl.reward.models._torch import chunks, model_device_dtype, torch_dtype
from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs

_QUOTED = re.compile(r'"([^"]+)"|“([^”]+)”|(?<!\w)\'([^\']+)\'(?!\w)')


def extract_quoted(prompt: str) -> str | None:
    """The first quoted span: 'a sign that says "OPEN 24h"' -> 'OPEN 24h'."""
    m = _QUOTED.search(prompt)
    return next(g for g in m.groups() if g) if m else None


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert/delete/substitute, cost 1), O(len(a) * len(b))."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _norm(s: str) -> str:
    return "".join(s.lower().split())


def ocr_reward(read: str, target: str) -> float:
    """max(0, 1 - lev(read, target) / len(target)) on lower-cased, whitespace-free text.

    >>> ocr_reward("0PEN", "open")  # one substitution in four characters
    0.75
    """
    t = _norm(target)
    if not t:
        return 0.0
    return max(0.0, 1.0 - levenshtein(_norm(read)[: 4 * len(t)], t) / len(t))


class OcrEngine(Protocol):
    def read(self, images: Sequence[np.ndarray]) -> list[str]: ...


class TrOcrEngine:
    """Greedy TrOCR decoding of uint8 HWC images."""

    def __init__(self, model: Any, processor: Any, batch_size: int = 8, max_new_tokens: int = 32) -> None:
        self.model, self.processor = model.eval(), processor
        self.batch_size, self.max_new_tokens = batch_size, max_new_tokens

    @classmethod
    def from_pretrained(
        cls, path: str, device: str = "cpu", dtype: str = "float32", batch_size: int = 8
    ) -> TrOcrEngine:
        tf = require("ocr", "transformers")
        model = tf.VisionEncoderDecoderModel.from_pretrained(
            path, local_files_only=True, dtype=torch_dtype(dtype)
        )
        return cls(
            model.to(device), tf.AutoProcessor.from_pretrained(path, local_files_only=True), batch_size
        )

    def read(self, images: Sequence[np.ndarray]) -> list[str]:
        import torch

        device, dtype = model_device_dtype(self.model)
        out: list[str] = []
        with torch.inference_mode():
            for batch in chunks(images, self.batch_size):
                pix = self.processor(images=list(batch), return_tensors="pt").pixel_values.to(device, dtype)
                ids = self.model.generate(
                    pixel_values=pix, max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1
                )
                out.extend(self.processor.batch_decode(ids, skip_special_tokens=True))
        return out


class OcrScorer:
    modality: Modality = "image+text"
    output_range = (0.0, 1.0)
    name = "ocr"

    def __init__(self, engine: OcrEngine, version: str = "1") -> None:
        self.engine, self.version = engine, version

    @classmethod
    def from_pretrained(
        cls, model_path: str, device: str = "cpu", dtype: str = "float32", batch_size: int = 8
    ) -> OcrScorer:
        engine = TrOcrEngine.from_pretrained(model_path, device, dtype, batch_size)
        return cls(engine, version=f"1+{model_path.rstrip('/').split('/')[-1]}+{dtype}")

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        targets = []
        for i, it in enumerate(items):
            t = extract_quoted(it.prompt or "")
            if t is None:
                raise ValueError(
                    f"scorer {self.name!r}: item {i} prompt has no quoted text to match: {it.prompt!r:.80}"
                )
            targets.append(t)
        if not items:
            return []
        read = self.engine.read([it.image for it in items])  # type: ignore[misc]
        return [ScoreResult(total=ocr_reward(r, t)) for r, t in zip(read, targets)]
