"""Model configs the recipes name: each builds a bundle through its real loading path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from unirl.apps.image_models import (
    Flux2KleinModelConfig,
    FluxModelConfig,
    HunyuanVideoModelConfig,
    QwenImageModelConfig,
    WanModelConfig,
    ZImageModelConfig,
    torch_dtype,
)

if TYPE_CHECKING:
    from unirl.rollout.models.base import FlowBundle

_STRICT = ConfigDict(extra="forbid", frozen=True)
DType = Literal["float32", "bfloat16", "float16"]


class SD3ModelConfig(BaseModel):
    """Stable Diffusion 3 / 3.5 through diffusers: ``path`` is a local folder or hub id.

    With ``path: null`` a tiny random SD3 is built in code (same classes, tiny config): the CPU
    variant every SD3 recipe has."""

    model_config = _STRICT
    kind: Literal["sd3"] = "sd3"
    path: str | None = None
    dtype: DType = "float32"
    max_sequence_length: int = Field(default=256, ge=1)

    def build(self, device: torch.device, seed: int) -> FlowBundle:
        from unirl.rollout.models.sd3 import SD3Bundle

        if self.path is None:
            return SD3Bundle.tiny(seed=seed).to(device)
        return SD3Bundle.from_pretrained(
            self.path,
            dtype=torch_dtype(self.dtype),
            device=device,
            max_sequence_length=self.max_sequence_length,
        )


class TinyShapesModelConfig(BaseModel):
    """The small pixel-space text-to-image model trained from scratch on the shapes world: a tiny
    U-Net (or a tiny SD3Transformer2DModel on pixels) with a frozen word-level text encoder.

    The U-Net is the default: on a 2-core CPU budget the pixel SD3 transformer had not formed
    coherent objects after ~2k steps, the U-Net had after ~300 (experiments/feasibility.py)."""

    model_config = _STRICT
    kind: Literal["tiny_shapes"] = "tiny_shapes"
    arch: Literal["unet", "sd3"] = "unet"
    resolution: int = Field(default=32, ge=8, description="must equal data.resolution")
    unet_channels: int = Field(default=32, ge=4, description="arch=unet only")
    unet_coord_channels: bool = Field(
        default=False, description="arch=unet only: row/column coordinate planes as extra input channels"
    )
    unet_text_layers: int = Field(
        default=0, ge=0, description="arch=unet only: trainable transformer layers over the text tokens"
    )
    patch_size: int = Field(default=4, ge=1, description="arch=sd3 only")
    num_layers: int = Field(default=4, ge=1, description="arch=sd3 only")
    num_heads: int = Field(default=4, ge=1, description="arch=sd3 only")
    head_dim: int = Field(default=16, ge=4, description="arch=sd3 only")
    text_dim: int = Field(default=64, ge=8)
    text_layers: int = Field(default=2, ge=1)
    text_pos_std: float = Field(
        default=0.02,
        ge=0.0,
        description="init std of the frozen text encoder's positions (~1 keeps word order)",
    )

    def build(self, device: torch.device, seed: int) -> FlowBundle:
        from unirl.rollout.models.tiny.pixel_bundle import PixelFlowBundle

        return PixelFlowBundle.shapes(**self.model_dump(exclude={"kind"}), seed=seed).to(device)


class TinyVideoModelConfig(BaseModel):
    """The small pixel-space text-to-video model trained from scratch on the moving-shapes world:
    a factorised space / time U-Net (``TinyVideoUNet``) with a frozen word-level text encoder."""

    model_config = _STRICT
    kind: Literal["tiny_moving_shapes"] = "tiny_moving_shapes"
    resolution: int = Field(default=16, ge=8, description="frame side; must equal data.resolution")
    channels: int = Field(default=16, ge=8, description="U-Net width (a multiple of 8)")
    text_dim: int = Field(default=64, ge=8)
    text_layers: int = Field(default=2, ge=1)
    unet_text_layers: int = Field(default=1, ge=0, description="trainable text layers inside the U-Net")
    max_frames: int = Field(default=16, ge=1, description="frames the frame embedding covers")
    fps: float = Field(default=4.0, gt=0)

    def build(self, device: torch.device, seed: int) -> FlowBundle:
        from unirl.rollout.models.tiny.video_bundle import PixelVideoBundle

        kw = self.model_dump(exclude={"kind", "resolution"})
        return PixelVideoBundle.tiny(**kw, seed=seed).to(device)


DiffusionModelConfig = Annotated[
    SD3ModelConfig
    | TinyShapesModelConfig
    | TinyVideoModelConfig
    | FluxModelConfig
    | QwenImageModelConfig
    | Flux2KleinModelConfig
    | ZImageModelConfig
    | WanModelConfig
    | HunyuanVideoModelConfig,
    Field(discriminator="kind"),
]
