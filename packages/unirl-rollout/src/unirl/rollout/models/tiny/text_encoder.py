"""A tiny from-scratch text encoder for closed-vocabulary worlds (e.g. the shapes world).

`WordTokenizer` maps whitespace-separated words of a fixed vocabulary to ids (pad=0, unk=1,
cls=2, words from 3) and always prepends a CLS token, so even the empty (unconditional) prompt
has one valid position. `TinyTextEncoder` is a small pre-norm transformer encoder that returns
what an SD3-style transformer consumes: per-token `encoder_hidden_states` [B, L, joint_dim] and
`pooled_projections` [B, pooled_dim] (read from the CLS position).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

PAD_ID, UNK_ID, CLS_ID = 0, 1, 2
_NUM_SPECIAL = 3


class WordTokenizer:
    """Word-level tokenizer over a fixed vocabulary; unknown words map to UNK."""

    def __init__(self, vocab: Sequence[str], max_length: int = 16) -> None:
        words = list(dict.fromkeys(w.lower() for w in vocab))
        if any(len(w.split()) != 1 for w in words):
            raise ValueError(f"vocab entries must be single words without spaces, got {words!r}")
        if max_length < 2:
            raise ValueError(f"max_length={max_length}: need >= 2 (CLS + one word)")
        self.vocab = words
        self.max_length = max_length
        self._ids = {w: i + _NUM_SPECIAL for i, w in enumerate(words)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) + _NUM_SPECIAL

    def encode(self, text: str) -> list[int]:
        """CLS followed by one id per word; ValueError if longer than max_length."""
        ids = [CLS_ID] + [self._ids.get(w, UNK_ID) for w in text.lower().split()]
        if len(ids) > self.max_length:
            raise ValueError(
                f"text {text!r} has {len(ids) - 1} words; max_length={self.max_length} allows "
                f"{self.max_length - 1}: raise WordTokenizer.max_length"
            )
        return ids

    def __call__(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ids [B, max_length] (long) and attention mask [B, max_length] (bool)."""
        ids_BL = torch.full((len(texts), self.max_length), PAD_ID, dtype=torch.long)
        for b, text in enumerate(texts):
            row = self.encode(text)
            ids_BL[b, : len(row)] = torch.tensor(row)
        return ids_BL, ids_BL != PAD_ID


def pre_norm_encoder(dim: int, num_heads: int, num_layers: int) -> nn.TransformerEncoder:
    """`num_layers` pre-norm transformer encoder layers (FFN 2x dim, no dropout, batch first)."""
    layer = nn.TransformerEncoderLayer(
        dim, num_heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True, norm_first=True
    )
    return nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)


class TinyTextEncoder(nn.Module):
    """Embedding + learned positions + a few transformer encoder layers.

    forward(ids [B, L], mask [B, L]) -> (encoder_hidden_states [B, L, joint_dim],
    pooled_projections [B, pooled_dim]). Padded positions of the hidden states are zeroed so a
    joint-attention transformer that ignores the mask sees them as empty tokens.
    """

    def __init__(
        self,
        vocab_size: int,
        max_length: int = 16,
        dim: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        joint_dim: int = 64,
        pooled_dim: int = 64,
        pos_init_std: float = 0.02,
    ) -> None:
        super().__init__()
        if pos_init_std < 0:
            raise ValueError(f"pos_init_std={pos_init_std}: must be >= 0")
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=PAD_ID)
        self.pos = nn.Parameter(torch.zeros(1, max_length, dim))
        # Token embeddings start at std 1: positions at std 0.02 leave a frozen random encoder
        # nearly order-blind (one word at two positions: cosine 0.9996 of its two outputs); at
        # std 1, 0.40-0.82, so the per-token outputs keep the word order (apps/tests/test_worlds_models.py).
        nn.init.normal_(self.pos, std=pos_init_std)
        self.layers = pre_norm_encoder(dim, num_heads, num_layers)
        self.norm = nn.LayerNorm(dim)
        self.to_hidden = nn.Linear(dim, joint_dim)
        self.to_pooled = nn.Linear(dim, pooled_dim)

    def forward(self, ids_BL: torch.Tensor, mask_BL: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h_BLD = self.embed(ids_BL) + self.pos[:, : ids_BL.shape[1]]
        h_BLD = self.norm(self.layers(h_BLD, src_key_padding_mask=~mask_BL))
        hidden_BLJ = self.to_hidden(h_BLD) * mask_BL.unsqueeze(-1).to(h_BLD.dtype)
        return hidden_BLJ, self.to_pooled(h_BLD[:, 0])
