"""LAION aesthetic predictor (improved-aesthetic-predictor v2): MLP head on CLIP image embeddings.

score = head(normalize(clip_image_embedding)); the released head sits on CLIP ViT-L/14
(768-d) and predicts a 1-10 rating. The head loads from a safetensors file (the released
`sac+logos+ava1-l14-linearMSE.pth` converted once with `safetensors.torch.save_file`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from unirl.reward.models._torch import model_device_dtype
from unirl.reward.models.clip import ClipBackbone
from unirl.reward.models.mlp_head import load_head
from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs


class AestheticScorer:
    """Image-only aesthetic rating (unbounded in principle; ~1-10 for the released head)."""

    modality: Modality = "image"
    output_range = (float("-inf"), float("inf"))
    name = "aesthetic"

    def __init__(self, backbone: ClipBackbone, head: Any, version: str = "1") -> None:
        proj = int(backbone.model.config.projection_dim)
        if head.input_dim != proj:
            raise ValueError(
                f"aesthetic head expects {head.input_dim}-d embeddings but the CLIP model gives {proj}-d"
            )
        device, _ = model_device_dtype(backbone.model)
        self.backbone, self.head, self.version = backbone, head.to(device), version

    @classmethod
    def from_pretrained(
        cls,
        model_path: str,
        head_path: str,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 16,
    ) -> AestheticScorer:
        bb = ClipBackbone.from_pretrained(model_path, device, dtype, batch_size, extra="aesthetic")
        return cls(bb, load_head(head_path), version=f"1+{head_path.rstrip('/').split('/')[-1]}")

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        import torch

        check_inputs(self.name, self.modality, items)
        if not items:
            return []
        emb = self.backbone.image_embeds([it.image for it in items])  # type: ignore[misc]
        with torch.inference_mode():
            vals = self.head(emb.to(next(self.head.parameters()).device)).squeeze(-1)
        return [ScoreResult(total=float(v)) for v in vals.tolist()]
