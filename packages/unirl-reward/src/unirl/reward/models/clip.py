"""CLIP-family scorers on transformers `CLIPModel`: CLIP score, PickScore, HPSv2.

- `ClipScorer`: CLIPScore as in torchmetrics, 100 * max(cos(image, text), 0), range [0, 100].
- `PickScoreScorer`: PickScore (Kirstain et al. 2023) as in its reference code,
  logit_scale.exp() * cos(image, text); PickScore_v1 is a CLIPModel checkpoint, so this is the
  authors' architecture and formula exactly. Range [-100, 100] (logit scale capped at 100).
- `HPSv2Scorer`: HPSv2 (Wu et al. 2023) = cos(image, text) of a fine-tuned OpenCLIP ViT-H-14.
  The `hpsv2` PyPI package needs open_clip and downloads its checkpoint from the hub at run
  time, so it is unusable offline; this scorer runs the same architecture through transformers'
  CLIPModel (a ViT-H-14 OpenCLIP checkpoint converted to the CLIPModel layout, e.g. with
  transformers' convert_clip_original_pytorch_to_hf) and the same formula. Range [-1, 1].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from unirl.reward.models._extras import require
from unirl.reward.models._torch import chunks, model_device_dtype, torch_dtype
from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs


class ClipBackbone:
    """A CLIPModel + CLIPProcessor pair producing unit-norm image and text embeddings."""

    def __init__(self, model: Any, processor: Any, batch_size: int = 16) -> None:
        self.model, self.processor, self.batch_size = model.eval(), processor, batch_size
        cfg = model.config.text_config
        self.max_text_len = min(int(cfg.max_position_embeddings), 77)

    @classmethod
    def from_pretrained(
        cls,
        model_path: str,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 16,
        processor_path: str | None = None,
        extra: str = "clip",
    ) -> ClipBackbone:
        tf = require(extra, "transformers")
        model = tf.CLIPModel.from_pretrained(model_path, local_files_only=True, dtype=torch_dtype(dtype))
        processor = tf.CLIPProcessor.from_pretrained(processor_path or model_path, local_files_only=True)
        return cls(model.to(device), processor, batch_size)

    def image_embeds(self, images: Sequence[np.ndarray]) -> Any:
        """[N, D] float32 unit vectors of uint8 HWC images."""
        import torch

        device, dtype = model_device_dtype(self.model)
        out = []
        with torch.inference_mode():
            for batch in chunks(images, self.batch_size):
                pix = self.processor(images=list(batch), return_tensors="pt")["pixel_values"].to(
                    device, dtype
                )
                pooled = self.model.vision_model(pixel_values=pix).pooler_output
                out.append(
                    torch.nn.functional.normalize(self.model.visual_projection(pooled).float(), dim=-1)
                )
        return torch.cat(out)

    def text_embeds(self, texts: Sequence[str]) -> Any:
        """[N, D] float32 unit vectors (texts truncated to the model's context)."""
        import torch

        device, _ = model_device_dtype(self.model)
        out = []
        with torch.inference_mode():
            for batch in chunks(texts, self.batch_size):
                enc = self.processor(
                    text=list(batch),
                    padding=True,
                    truncation=True,
                    max_length=self.max_text_len,
                    return_tensors="pt",
                ).to(device)
                pooled = self.model.text_model(
                    input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]
                ).pooler_output
                out.append(torch.nn.functional.normalize(self.model.text_projection(pooled).float(), dim=-1))
        return torch.cat(out)

    def cosine(self, items: Sequence[ScoreItem]) -> Any:
        """[N] cos(image_i, prompt_i)."""
        img = self.image_embeds([it.image for it in items])  # type: ignore[misc]
        txt = self.text_embeds([it.prompt or "" for it in items])
        return (img * txt).sum(-1)

    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().exp().clamp(max=100.0))


class _ClipBase:
    modality: Modality = "image+text"
    name = "clip"
    extra = "clip"

    def __init__(self, backbone: ClipBackbone, version: str = "1") -> None:
        self.backbone, self.version = backbone, version

    @classmethod
    def from_pretrained(
        cls,
        model_path: str,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 16,
        processor_path: str | None = None,
    ) -> Any:
        bb = ClipBackbone.from_pretrained(model_path, device, dtype, batch_size, processor_path, cls.extra)
        return cls(bb, version=f"1+{model_path.rstrip('/').split('/')[-1]}+{dtype}")

    def _values(self, cos: Any) -> Any:
        raise NotImplementedError

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        if not items:
            return []
        cos = self.backbone.cosine(items)
        return [
            ScoreResult(total=float(v), components={"cosine": float(c)})
            for v, c in zip(self._values(cos).tolist(), cos.tolist())
        ]


class ClipScorer(_ClipBase):
    """CLIPScore: 100 * max(cos, 0)."""

    name = "clip_score"
    output_range = (0.0, 100.0)

    def _values(self, cos: Any) -> Any:
        return 100.0 * cos.clamp(min=0.0)


class PickScoreScorer(_ClipBase):
    """PickScore: logit_scale.exp() * cos."""

    name = "pickscore"
    extra = "pickscore"
    output_range = (-100.0, 100.0)

    def _values(self, cos: Any) -> Any:
        return self.backbone.logit_scale() * cos


class HPSv2Scorer(_ClipBase):
    """HPSv2: cos of the HPS-tuned ViT-H-14 embeddings."""

    name = "hpsv2"
    extra = "hpsv2"
    output_range = (-1.0, 1.0)

    def _values(self, cos: Any) -> Any:
        return cos.clamp(-1.0, 1.0)
