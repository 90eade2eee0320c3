"""A tiny text-conditioned pixel-space video U-Net: factorised space / time for CPU-sized video flow matching.

The image ``TinyUNet``'s blocks run on every frame (frames folded into the batch); after each
spatial block a temporal convolution (kernel 3 along the frame axis, zero-initialised residual)
mixes neighbouring frames, and the bottleneck attends jointly over every frame's tokens and the
text tokens, so where an object is in one frame is decided together with where it is in the
others (motion is a relation between frames). Each frame's FiLM conditioning adds a learned
frame-index embedding to the timestep + text embedding.

Same call signature as diffusers' SD3Transformer2DModel (``hidden_states`` [B, C, F, H, W],
``encoder_hidden_states``, ``pooled_projections``, ``timestep`` = 1000 sigma, ``return_dict``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from unirl.rollout.models.tiny.unet import ResBlock, TextLayers, coordinate_planes, timestep_embedding

__all__ = ["TemporalMix", "TinyVideoUNet"]


class TemporalMix(nn.Module):
    """Residual GroupNorm-SiLU-conv along the frame axis only (kernel 3, zero-initialised output)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(8, channels)
        self.conv = nn.Conv3d(channels, channels, (3, 1, 1), padding=(1, 0, 0))
        nn.init.zeros_(self.conv.weight)
        nn.init.zeros_(self.conv.bias)

    def forward(self, h_NCHW: torch.Tensor, frames: int) -> torch.Tensor:
        n, c, hh, ww = h_NCHW.shape
        x_BCFHW = h_NCHW.reshape(n // frames, frames, c, hh, ww).transpose(1, 2)
        y = self.conv(F.silu(self.norm(x_BCFHW)))
        return h_NCHW + y.transpose(1, 2).reshape(n, c, hh, ww)


class SpaceTimeAttention(nn.Module):
    """Self-attention over the tokens of ALL frames of a video plus its (projected) text tokens."""

    def __init__(self, channels: int, text_dim: int, heads: int = 4) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(8, channels)
        self.text = nn.Linear(text_dim, channels)
        self.attn = nn.MultiheadAttention(channels, heads, batch_first=True)
        self.out = nn.Linear(channels, channels)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, h_NCHW: torch.Tensor, text_BLD: torch.Tensor, frames: int) -> torch.Tensor:
        n, c, hh, ww = h_NCHW.shape
        b = n // frames
        # [B*F, C, h, w] -> [B, F*h*w, C]: every frame's tokens in one sequence
        img = self.norm(h_NCHW).reshape(b, frames, c, hh * ww).permute(0, 1, 3, 2).reshape(b, -1, c)
        tokens = torch.cat([img, self.text(text_BLD)], dim=1)
        y, _ = self.attn(img, tokens, tokens, need_weights=False)
        y = self.out(y).reshape(b, frames, hh * ww, c).permute(0, 1, 3, 2).reshape(n, c, hh, ww)
        return h_NCHW + y


class TinyVideoUNet(nn.Module):
    """Three-level factorised U-Net over videos [B, C, F, H, W] (H, W multiples of 8)."""

    def __init__(
        self,
        in_channels: int = 3,
        channels: int = 16,
        text_dim: int = 64,
        pooled_dim: int = 64,
        emb_dim: int = 128,
        *,
        max_frames: int = 16,
        coord_channels: bool = True,
        text_layers: int = 0,
    ) -> None:
        super().__init__()
        if text_layers < 0:
            raise ValueError(f"text_layers={text_layers}: must be >= 0")
        c1, c2 = channels, 2 * channels
        self.coord_channels = coord_channels
        self.max_frames = max_frames
        self.text_layers = TextLayers(text_dim, text_layers) if text_layers else None
        cond_dim = emb_dim + pooled_dim + (text_dim if text_layers else 0)
        self.emb = nn.Sequential(nn.Linear(cond_dim, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.frame_emb = nn.Embedding(max_frames, emb_dim)
        nn.init.normal_(self.frame_emb.weight, std=0.1)
        self.emb_dim = emb_dim
        self.conv_in = nn.Conv2d(in_channels + (2 if coord_channels else 0), c1, 3, padding=1)
        widths = [(c1, c1), (c1, c2), (c2, c2)]
        self.down = nn.ModuleList([ResBlock(a, b, emb_dim) for a, b in widths])
        self.down_t = nn.ModuleList([TemporalMix(b) for _, b in widths])
        self.pool = nn.ModuleList([nn.Conv2d(c, c, 3, stride=2, padding=1) for c in (c1, c2, c2)])
        self.mid1 = ResBlock(c2, c2, emb_dim)
        self.mid_attn = SpaceTimeAttention(c2, text_dim)
        self.mid2 = ResBlock(c2, c2, emb_dim)
        ups = [(2 * c2, c2), (2 * c2, c2), (c2 + c1, c1)]
        self.up = nn.ModuleList([ResBlock(a, b, emb_dim) for a, b in ups])
        self.up_t = nn.ModuleList([TemporalMix(b) for _, b in ups])
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
        b, c, frames, hh, ww = hidden_states.shape
        if frames > self.max_frames:
            raise ValueError(f"{frames} frames > max_frames={self.max_frames} of this TinyVideoUNet")
        t_emb = timestep_embedding(timestep, self.emb_dim).to(pooled_projections.dtype)
        cond = [t_emb, pooled_projections]
        if self.text_layers is not None:
            encoder_hidden_states = self.text_layers(encoder_hidden_states)
            cond.append(encoder_hidden_states[:, 0])
        emb_B = self.emb(torch.cat(cond, dim=-1))
        fr = self.frame_emb(torch.arange(frames, device=hidden_states.device)).to(emb_B.dtype)
        emb = (emb_B[:, None] + fr[None]).reshape(b * frames, -1)  # per (video, frame)
        x = hidden_states.transpose(1, 2).reshape(b * frames, c, hh, ww)  # frames folded into the batch
        if self.coord_channels:
            x = torch.cat([x, coordinate_planes(x)], dim=1)
        h = self.conv_in(x)
        skips = []
        for block, mix, pool in zip(self.down, self.down_t, self.pool):
            h = mix(block(h, emb), frames)
            skips.append(h)
            h = pool(h)
        h = self.mid2(self.mid_attn(self.mid1(h, emb), encoder_hidden_states, frames), emb)
        for block, mix in zip(self.up, self.up_t):
            h = F.interpolate(h, scale_factor=2.0, mode="nearest")
            h = mix(block(torch.cat([h, skips.pop()], dim=1), emb), frames)
        out = self.conv_out(F.silu(self.norm_out(h)))
        return (out.reshape(b, frames, c, hh, ww).transpose(1, 2).contiguous(),)
