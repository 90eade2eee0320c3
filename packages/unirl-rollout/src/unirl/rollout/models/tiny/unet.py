"""A tiny text-conditioned pixel-space U-Net velocity model for CPU-sized flow matching.

Same call signature as diffusers' SD3Transformer2DModel (`hidden_states`, `encoder_hidden_states`,
`pooled_projections`, `timestep` = 1000 sigma, `return_dict`), so a bundle can swap it in for the
transformer. Convolutions give objects local coherence from the first steps; the 4x4 bottleneck
runs joint attention over its 16 image tokens and the text tokens, so counts and relations (global
properties) are decided where every position sees every other. Conditioning: timestep embedding
plus pooled text, applied as FiLM (scale, shift) in every residual block.

Two options let the model place objects by the caption's word order ("red left of blue" vs "blue
left of red"), which a frozen text encoder alone does not give it:
- ``coord_channels``: two coordinate planes (row, column in [-1, 1]) are concatenated to the input
  (CoordConv), so every feature can depend on absolute position, not only on zero padding.
- ``text_layers``: trainable pre-norm transformer layers over the text tokens inside the velocity
  model (as MMDiT's text stream is trainable while its text encoder is frozen); their CLS output is
  added to the FiLM conditioning. RL trains them too.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from unirl.rollout.models.tiny.text_encoder import pre_norm_encoder


def timestep_embedding(t_B: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding [B, dim] of timesteps in [0, 1000]."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t_B.device) / half)
    args = t_B.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResBlock(nn.Module):
    """GroupNorm-SiLU-conv twice, FiLM from the conditioning vector, residual (1x1 if widths differ)."""

    def __init__(self, c_in: int, c_out: int, emb_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(8, c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.film = nn.Linear(emb_dim, 2 * c_out)
        self.norm2 = nn.GroupNorm(8, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        nn.init.zeros_(self.conv2.weight)
        nn.init.zeros_(self.conv2.bias)
        self.skip = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        scale, shift = self.film(emb)[:, :, None, None].chunk(2, dim=1)
        h = self.norm2(h) * (1 + scale) + shift
        return self.skip(x) + self.conv2(F.silu(h))


class JointAttention(nn.Module):
    """Self-attention over image tokens concatenated with (projected) text tokens; image part returned."""

    def __init__(self, channels: int, text_dim: int, heads: int = 4) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(8, channels)
        self.text = nn.Linear(text_dim, channels)
        self.attn = nn.MultiheadAttention(channels, heads, batch_first=True)
        self.out = nn.Linear(channels, channels)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x_BCHW: torch.Tensor, text_BLD: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x_BCHW.shape
        img_BNC = self.norm(x_BCHW).flatten(2).transpose(1, 2)
        tokens = torch.cat([img_BNC, self.text(text_BLD)], dim=1)
        y, _ = self.attn(img_BNC, tokens, tokens, need_weights=False)
        return x_BCHW + self.out(y).transpose(1, 2).reshape(b, c, h, w)


def coordinate_planes(x_BCHW: torch.Tensor) -> torch.Tensor:
    """[B, 2, H, W]: row and column coordinates in [-1, 1], dtype and device of x."""
    b, _, h, w = x_BCHW.shape
    rows = torch.linspace(-1.0, 1.0, h, device=x_BCHW.device, dtype=x_BCHW.dtype)
    cols = torch.linspace(-1.0, 1.0, w, device=x_BCHW.device, dtype=x_BCHW.dtype)
    grid = torch.stack(torch.meshgrid(rows, cols, indexing="ij"))
    return grid.unsqueeze(0).expand(b, 2, h, w)


class TextLayers(nn.Module):
    """Trainable transformer layers over the text tokens; padded tokens (all-zero rows, as the tiny
    text encoder emits them) are masked out and stay zero."""

    def __init__(self, text_dim: int, num_layers: int, heads: int = 4) -> None:
        super().__init__()
        self.layers = pre_norm_encoder(text_dim, heads, num_layers)
        self.norm = nn.LayerNorm(text_dim)

    def forward(self, text_BLD: torch.Tensor) -> torch.Tensor:
        valid_BL = text_BLD.abs().amax(dim=-1) > 0
        valid_BL[:, 0] = True  # CLS: never padding (also keeps an all-zero row from masking everything)
        h = self.norm(self.layers(text_BLD, src_key_padding_mask=~valid_BL))
        return h * valid_BL.unsqueeze(-1).to(h.dtype)


class TinyUNet(nn.Module):
    """Three-level U-Net (32 -> 16 -> 8 -> 4 for 32x32 inputs) with joint attention at the bottom."""

    def __init__(
        self,
        in_channels: int = 3,
        channels: int = 32,
        text_dim: int = 64,
        pooled_dim: int = 64,
        emb_dim: int = 128,
        *,
        coord_channels: bool = False,
        text_layers: int = 0,
    ) -> None:
        super().__init__()
        if text_layers < 0:
            raise ValueError(
                f"text_layers={text_layers}: must be >= 0 (0 = use the text encoder's tokens as is)"
            )
        c1, c2 = channels, 2 * channels
        self.coord_channels = coord_channels
        self.text_layers = TextLayers(text_dim, text_layers) if text_layers else None
        cond_dim = emb_dim + pooled_dim + (text_dim if text_layers else 0)
        self.emb = nn.Sequential(nn.Linear(cond_dim, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.emb_dim = emb_dim
        self.conv_in = nn.Conv2d(in_channels + (2 if coord_channels else 0), c1, 3, padding=1)
        self.down = nn.ModuleList(
            [ResBlock(c1, c1, emb_dim), ResBlock(c1, c2, emb_dim), ResBlock(c2, c2, emb_dim)]
        )
        self.pool = nn.ModuleList([nn.Conv2d(c, c, 3, stride=2, padding=1) for c in (c1, c2, c2)])
        self.mid1 = ResBlock(c2, c2, emb_dim)
        self.mid_attn = JointAttention(c2, text_dim)
        self.mid2 = ResBlock(c2, c2, emb_dim)
        self.up = nn.ModuleList(
            [ResBlock(2 * c2, c2, emb_dim), ResBlock(2 * c2, c2, emb_dim), ResBlock(c2 + c1, c1, emb_dim)]
        )
        self.norm_out = nn.GroupNorm(8, c1)
        self.conv_out = nn.Conv2d(c1, in_channels, 3, padding=1)
        nn.init.zeros_(self.conv_out.weight)
        nn.init.zeros_(self.conv_out.bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        pooled_projections: torch.Tensor,
        timestep: torch.Tensor,
        return_dict: bool = False,
    ) -> tuple[torch.Tensor]:
        # the sinusoid is computed in fp32; the model may run in bf16 (FSDP mixed precision on GPU)
        t_emb = timestep_embedding(timestep, self.emb_dim).to(pooled_projections.dtype)
        cond = [t_emb, pooled_projections]
        if self.text_layers is not None:
            encoder_hidden_states = self.text_layers(encoder_hidden_states)
            cond.append(encoder_hidden_states[:, 0])
        emb = self.emb(torch.cat(cond, dim=-1))
        if self.coord_channels:
            hidden_states = torch.cat([hidden_states, coordinate_planes(hidden_states)], dim=1)
        # NHWC activations (weights stay contiguous, as FSDP requires): a CPU training step at
        # 32x32 x 64 samples runs 10-30% faster than NCHW (experiments/bench_tiny_unet_layout.py)
        h = self.conv_in(hidden_states.contiguous(memory_format=torch.channels_last))
        skips = []
        for block, pool in zip(self.down, self.pool):
            h = block(h, emb)
            skips.append(h)
            h = pool(h)
        h = self.mid2(self.mid_attn(self.mid1(h, emb), encoder_hidden_states), emb)
        for block in self.up:
            h = F.interpolate(h, scale_factor=2.0, mode="nearest")
            h = block(torch.cat([h, skips.pop()], dim=1), emb)
        return (self.conv_out(F.silu(self.norm_out(h))).contiguous(),)
