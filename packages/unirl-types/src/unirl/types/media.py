"""Media primitives: the inputs and decoded outputs a Sample carries (text, image, video, audio)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from unirl.types.base import SchemaModel
from unirl.types.tensor import Tensor, dtype_name


class TextPrimitive(SchemaModel):
    """A piece of text: a prompt, a rewritten prompt, a generated answer."""

    kind: Literal["text"] = "text"
    text: str
    role: str | None = None
    """Optional chat role ("user", "assistant", "system") when the text is a chat turn."""


class ImagePrimitive(SchemaModel):
    """An image as uint8 pixels ``[H, W, C]`` (C = 1, 3 or 4)."""

    kind: Literal["image"] = "image"
    pixels: Tensor

    @field_validator("pixels")
    @classmethod
    def _hwc_uint8(cls, v: Tensor) -> Tensor:
        if dtype_name(v) != "uint8" or len(v.shape) != 3 or v.shape[2] not in (1, 3, 4):
            raise ValueError(
                f"pixels must be uint8 [H, W, C] with C in (1, 3, 4); got {dtype_name(v)} {list(v.shape)}"
            )
        return v


class VideoPrimitive(SchemaModel):
    """A video as uint8 frames ``[F, H, W, C]``."""

    kind: Literal["video"] = "video"
    frames: Tensor
    fps: float = Field(gt=0)

    @field_validator("frames")
    @classmethod
    def _fhwc_uint8(cls, v: Tensor) -> Tensor:
        if dtype_name(v) != "uint8" or len(v.shape) != 4 or v.shape[3] not in (1, 3, 4):
            raise ValueError(f"frames must be uint8 [F, H, W, C]; got {dtype_name(v)} {list(v.shape)}")
        return v


class AudioPrimitive(SchemaModel):
    """Audio as float samples ``[channels, samples]`` in [-1, 1]."""

    kind: Literal["audio"] = "audio"
    waveform: Tensor
    sample_rate: int = Field(gt=0)

    @field_validator("waveform")
    @classmethod
    def _cn_float(cls, v: Tensor) -> Tensor:
        if not dtype_name(v).startswith(("float", "bfloat")) or len(v.shape) != 2:
            raise ValueError(
                f"waveform must be float [channels, samples]; got {dtype_name(v)} {list(v.shape)}"
            )
        return v


Primitive = Annotated[
    TextPrimitive | ImagePrimitive | VideoPrimitive | AudioPrimitive, Field(discriminator="kind")
]
"""Any media primitive, told apart by ``kind``."""
