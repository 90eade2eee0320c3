"""A tiny unified AR + flow-matching model (Transfusion style), built in code from a config.

One transformer backbone reads one sequence: text tokens, then the image block. Text attends
causally over text (the text head predicts the next token); image tokens attend to every valid text
token and bidirectionally to each other (the image head predicts the flow-matching velocity of the
image latents). As in Transfusion, the image block enters and leaves the backbone through a small
conv encoder / decoder with skip connections (here over pixels in [-1, 1]: the identity "VAE" of
the shapes world); the timestep conditions the conv blocks (FiLM) and is added to every image token.

``TinyUnifiedModel.save_pretrained(dir)`` writes ``config.json`` + ``model.safetensors``;
``TinyUnifiedModel.from_pretrained(dir)`` rebuilds the model from the config and loads the weights
(strict: a missing or unexpected tensor is an error).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.nn import functional as F

from unirl.rollout.models.tiny.unet import ResBlock, coordinate_planes, timestep_embedding

__all__ = ["TinyUnifiedConfig", "TinyUnifiedModel", "joint_attention_mask"]

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


@dataclass(frozen=True)
class TinyUnifiedConfig:
    """Sizes of the tiny unified model (every field has a small CPU default).

    ``image_size``: side of the square image (pixels = latents); the conv encoder halves it twice, so
    the backbone sees ``(image_size // 4) ** 2`` image tokens. ``max_text_len``: text positions
    (prompt + plan + separators)."""

    vocab_size: int
    hidden_size: int = 64
    num_layers: int = 3
    num_heads: int = 4
    mlp_ratio: int = 4
    max_text_len: int = 24
    image_size: int = 32
    image_channels: int = 3
    conv_channels: tuple[int, int] = (16, 32)
    model_type: str = field(default="unirl_tiny_unified")

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}"
            )
        if self.image_size % 4:
            raise ValueError(f"image_size={self.image_size} must be a multiple of 4 (two 2x downsamplings)")
        if any(c % 8 for c in self.conv_channels):
            raise ValueError(f"conv_channels={self.conv_channels}: each must be a multiple of 8 (GroupNorm)")

    @property
    def image_tokens(self) -> int:
        return (self.image_size // 4) ** 2


def joint_attention_mask(text_mask_BL: Tensor, num_image: int) -> Tensor:
    """Boolean ``[B, 1, L + N, L + N]`` (True = may attend) for text ``[B, L]`` then N image tokens.

    Text queries: causal over valid text. Image queries: every valid text token and every image
    token. Each query also sees itself, so a padded text row is never empty (its output is unused).
    """
    B, L = text_mask_BL.shape
    n, dev = L + num_image, text_mask_BL.device
    valid_k = torch.cat([text_mask_BL.bool(), torch.ones(B, num_image, dtype=torch.bool, device=dev)], 1)
    causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    allowed = torch.zeros(n, n, dtype=torch.bool, device=dev)
    allowed[:L, :L] = causal
    allowed[L:, :] = True
    mask = allowed[None] & valid_k[:, None, :]
    return (mask | torch.eye(n, dtype=torch.bool, device=dev)[None]).unsqueeze(1)


class Block(nn.Module):
    """Pre-norm transformer block: masked self-attention + MLP."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x_BND: Tensor, mask_B1NN: Tensor) -> Tensor:
        B, N, D = x_BND.shape
        q, k, v = self.qkv(self.norm1(x_BND)).view(B, N, 3, self.heads, D // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask_B1NN
        )
        x_BND = x_BND + self.proj(y.transpose(1, 2).reshape(B, N, D))
        return x_BND + self.mlp(self.norm2(x_BND))


class TinyUnifiedModel(nn.Module):
    """The backbone with its two heads: ``text_logits`` (next token) and ``velocity`` (image latents)."""

    def __init__(self, config: TinyUnifiedConfig) -> None:
        super().__init__()
        self.config = c = config
        D, (c1, c2) = c.hidden_size, c.conv_channels
        self.tok = nn.Embedding(c.vocab_size, D)
        nn.init.normal_(
            self.tok.weight, std=0.02
        )  # tied to the text head: N(0, 1) rows give logits of std ~sqrt(D)
        self.text_pos = nn.Parameter(torch.randn(1, c.max_text_len, D) * 0.02)
        self.image_pos = nn.Parameter(torch.randn(1, c.image_tokens, D) * 0.02)
        self.blocks = nn.ModuleList(Block(D, c.num_heads, c.mlp_ratio) for _ in range(c.num_layers))
        self.norm = nn.LayerNorm(D)
        # text head: tied to the token embedding
        # image encoder / decoder (Transfusion's U-Net down / up blocks around the backbone)
        self.t_emb = nn.Sequential(nn.Linear(D, D), nn.SiLU(), nn.Linear(D, D))
        self.conv_in = nn.Conv2d(c.image_channels + 2, c1, 3, padding=1)
        self.pool1 = nn.Conv2d(c1, c1, 3, stride=2, padding=1)
        self.down2, self.pool2 = ResBlock(c1, c2, D), nn.Conv2d(c2, c2, 3, stride=2, padding=1)
        self.to_tokens, self.from_tokens = nn.Linear(c2, D), nn.Linear(D, c2)
        self.up2 = ResBlock(2 * c2, c2, D)
        # full resolution: only light layers (a 1x1 mix of the upsampled features with the input's
        # skip, then the output conv); the 3x3 work happens at 1/2 and 1/4 resolution
        self.up1 = nn.Conv2d(c2 + c1, c1, 1)
        self.norm_out = nn.GroupNorm(8, c1)
        self.conv_out = nn.Conv2d(c1, c.image_channels, 3, padding=1)
        nn.init.zeros_(self.conv_out.weight)
        nn.init.zeros_(self.conv_out.bias)

    # ---- the backbone -------------------------------------------------------------------------
    def _text_embed(self, ids_BL: Tensor) -> Tensor:
        L = ids_BL.shape[1]
        if self.config.max_text_len < L:
            raise ValueError(f"{L} text tokens; the model has max_text_len={self.config.max_text_len}")
        return self.tok(ids_BL) + self.text_pos[:, :L]

    def _backbone(self, h_BND: Tensor, mask_B1NN: Tensor) -> Tensor:
        for block in self.blocks:
            h_BND = block(h_BND, mask_B1NN)
        return self.norm(h_BND)

    def forward(
        self,
        ids_BL: Tensor,
        mask_BL: Tensor,
        latents_BCHW: Tensor | None = None,
        sigma_B: Tensor | None = None,
    ) -> Tensor:
        """Text only: next-token logits ``[B, L, V]``; with an image block: its velocity. Both heads
        run through ``forward`` so wrappers that hook it (FSDP2 unsharding, LoRA) see every call."""
        if latents_BCHW is None:
            h = self._backbone(self._text_embed(ids_BL), joint_attention_mask(mask_BL, 0))
            return (h @ self.tok.weight.T).float()
        if sigma_B is None:
            raise ValueError("the image head needs sigma_B with latents_BCHW")
        return self._velocity(latents_BCHW, sigma_B, ids_BL, mask_BL)

    def text_logits(self, ids_BL: Tensor, mask_BL: Tensor) -> Tensor:
        """Next-token logits ``[B, L, V]`` (fp32) for right-padded text ``ids_BL`` with ``mask_BL``."""
        return self(ids_BL, mask_BL)  # type: ignore[no-any-return]

    def velocity(self, latents_BCHW: Tensor, sigma_B: Tensor, ids_BL: Tensor, mask_BL: Tensor) -> Tensor:
        """Velocity ``v ~ eps - x0`` ``[B, C, H, W]`` of the image block at ``sigma_B`` (in [0, 1]),
        given the text context (prompt + plan) ``ids_BL`` / ``mask_BL``."""
        return self(ids_BL, mask_BL, latents_BCHW, sigma_B)  # type: ignore[no-any-return]

    def _velocity(self, latents_BCHW: Tensor, sigma_B: Tensor, ids_BL: Tensor, mask_BL: Tensor) -> Tensor:
        B, _, H, W = latents_BCHW.shape
        # the sinusoid in fp32, then the compute dtype (bf16 latents under FSDP2 mixed precision)
        emb = self.t_emb(
            timestep_embedding(sigma_B.float() * 1000.0, self.config.hidden_size).to(latents_BCHW.dtype)
        )
        x = torch.cat([latents_BCHW, coordinate_planes(latents_BCHW)], dim=1)
        s1 = self.conv_in(x)  # [B, c1, H, W]
        s2 = self.down2(self.pool1(s1), emb)  # [B, c2, H/2, W/2]
        g = self.pool2(s2)  # [B, c2, H/4, W/4]
        img_BND = self.to_tokens(g.flatten(2).transpose(1, 2)) + self.image_pos + emb[:, None]
        N, L = img_BND.shape[1], ids_BL.shape[1]
        h = torch.cat([self._text_embed(ids_BL), img_BND], dim=1)
        h = self._backbone(h, joint_attention_mask(mask_BL, N))[:, L:]
        g = self.from_tokens(h).transpose(1, 2).reshape(B, -1, H // 4, W // 4)
        u = self.up2(torch.cat([F.interpolate(g, scale_factor=2.0, mode="nearest"), s2], 1), emb)
        u = self.up1(torch.cat([F.interpolate(u, scale_factor=2.0, mode="nearest"), s1], 1))
        return self.conv_out(F.silu(self.norm_out(u)))

    # ---- save / load --------------------------------------------------------------------------
    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` (fp32 as held) to ``directory``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, d / WEIGHTS_FILE)
        return d

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, *, device: str | torch.device = "cpu"
    ) -> TinyUnifiedModel:
        """Rebuild from ``config.json`` and load ``model.safetensors`` strictly."""
        d = Path(directory)
        if not (d / CONFIG_FILE).is_file() or not (d / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(
                f"{d} is not a tiny unified checkpoint: it needs {CONFIG_FILE} and {WEIGHTS_FILE} "
                "(written by TinyUnifiedModel.save_pretrained)"
            )
        raw = json.loads((d / CONFIG_FILE).read_text())
        raw["conv_channels"] = tuple(raw["conv_channels"])
        if raw.get("model_type") != "unirl_tiny_unified":
            raise ValueError(
                f"{d / CONFIG_FILE}: model_type={raw.get('model_type')!r}, expected 'unirl_tiny_unified'"
            )
        model = cls(TinyUnifiedConfig(**raw))
        model.load_state_dict(load_file(d / WEIGHTS_FILE), strict=True)
        return model.to(device)
