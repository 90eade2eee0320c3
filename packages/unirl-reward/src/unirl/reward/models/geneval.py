"""GenEval-style scorer: a detector finds the spec's objects, `geneval_logic` checks them.

total = fraction of the spec's checks that pass (presence or count, colour, position), in
[0, 1]; components hold each check and `strict` (1.0 only when all pass, GenEval's metric).
The detector is a protocol; `OwlViTDetector` is open-vocabulary (queries are the spec's object
names) on transformers' OwlViTForObjectDetection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from unirl.reward.models._extras import require
from unirl.reward.models._torch import model_device_dtype, torch_dtype
from unirl.reward.models.geneval_logic import Detection, Spec, evaluate, nms
from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs


def _clip_box(box: list[float], w: int, h: int) -> tuple[float, float, float, float]:
    x0, y0, x1, y1 = box
    return (min(max(x0, 0.0), w), min(max(y0, 0.0), h), min(max(x1, 0.0), w), min(max(y1, 0.0), h))


class Detector(Protocol):
    def detect(self, images: Sequence[np.ndarray], queries: Sequence[Sequence[str]]) -> list[list[Detection]]:
        """Boxes per image for that image's text queries (labels are query strings)."""
        ...


class OwlViTDetector:
    """Open-vocabulary detection with OwlViT; keeps boxes above `score_threshold`, then NMS."""

    def __init__(self, model: Any, processor: Any, score_threshold: float = 0.3) -> None:
        self.model, self.processor, self.score_threshold = model.eval(), processor, score_threshold

    @classmethod
    def from_pretrained(
        cls, path: str, device: str = "cpu", dtype: str = "float32", score_threshold: float = 0.3
    ) -> OwlViTDetector:
        tf = require("geneval", "transformers")
        model = tf.OwlViTForObjectDetection.from_pretrained(
            path, local_files_only=True, dtype=torch_dtype(dtype)
        )
        return cls(
            model.to(device), tf.OwlViTProcessor.from_pretrained(path, local_files_only=True), score_threshold
        )

    def detect(self, images: Sequence[np.ndarray], queries: Sequence[Sequence[str]]) -> list[list[Detection]]:
        import torch

        device, dtype = model_device_dtype(self.model)
        width = max(len(q) for q in queries)
        padded = [list(q) + [""] * (width - len(q)) for q in queries]  # OwlViT needs equal query counts
        enc = self.processor(
            text=padded, images=list(images), return_tensors="pt", padding=True, truncation=True
        )
        enc = {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) for k, v in enc.items()}
        with torch.inference_mode():
            out = self.model(**enc)
        sizes = torch.tensor([im.shape[:2] for im in images], device=device)
        results = self.processor.image_processor.post_process_object_detection(
            out, threshold=self.score_threshold, target_sizes=sizes
        )
        dets = []
        for q, res, im in zip(queries, results, images):
            h, w = im.shape[:2]
            found = [
                Detection(q[int(lbl)], float(s), _clip_box(box, w, h))
                for s, lbl, box in zip(res["scores"].tolist(), res["labels"].tolist(), res["boxes"].tolist())
                if int(lbl) < len(q)
            ]
            dets.append(nms(found))
        return dets


class GenEvalScorer:
    modality: Modality = "image"
    output_range = (0.0, 1.0)
    name = "geneval"

    def __init__(self, detector: Detector, batch_size: int = 8, version: str = "1") -> None:
        self.detector, self.batch_size, self.version = detector, batch_size, version

    @classmethod
    def from_pretrained(
        cls,
        model_path: str,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 8,
        score_threshold: float = 0.3,
    ) -> GenEvalScorer:
        det = OwlViTDetector.from_pretrained(model_path, device, dtype, score_threshold)
        return cls(det, batch_size, version=f"1+{model_path.rstrip('/').split('/')[-1]}+t{score_threshold}")

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        specs = []
        for i, it in enumerate(items):
            try:
                specs.append(Spec.from_metadata(it.metadata))
            except ValueError as e:
                raise ValueError(f"scorer {self.name!r}: item {i}: {e}") from None
        out: list[ScoreResult] = []
        for s in range(0, len(items), self.batch_size):
            batch, bspecs = items[s : s + self.batch_size], specs[s : s + self.batch_size]
            dets = self.detector.detect([it.image for it in batch], [sp.objects for sp in bspecs])  # type: ignore[misc]
            for it, sp, d in zip(batch, bspecs, dets):
                checks = evaluate(sp, d, it.image)  # type: ignore[arg-type]
                parts = [v for k, v in checks.items() if k != "strict"]
                out.append(ScoreResult(total=sum(parts) / len(parts), components=checks))
        return out
