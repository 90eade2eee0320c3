"""Tiny random-weight models built in code and saved as local from_pretrained folders (no hub)."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ["a", "red", "blue", "green", "cube", "ball", "cat", "dog", "photo", "of", "two", "the", "left", "sign", "says"]


def _clip_tokenizer(d: Path):
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789":
        vocab[ch] = len(vocab)
        vocab[ch + "</w>"] = len(vocab)
    for w in WORDS:
        vocab.setdefault(w + "</w>", len(vocab))
    d.mkdir(parents=True, exist_ok=True)
    (d / "vocab.json").write_text(json.dumps(vocab))
    (d / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(d / "vocab.json"), str(d / "merges.txt")), len(vocab)


def tiny_clip(root: Path, projection_dim: int = 16) -> Path:
    """A CLIPModel (2 layers, width 32, 32x32 images) + CLIPProcessor saved under root/'clip'."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    torch.manual_seed(0)
    tok, n = _clip_tokenizer(root / "clip_tok")
    ip = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    cfg = CLIPConfig(
        text_config=dict(vocab_size=n, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=40, bos_token_id=0, eos_token_id=1, pad_token_id=1),
        vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=2),
        projection_dim=projection_dim,
    )
    out = root / "clip"
    CLIPModel(cfg).save_pretrained(out)
    CLIPProcessor(image_processor=ip, tokenizer=tok).save_pretrained(out)
    return out


def bert_vocab(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", "[ENC]", *WORDS, *"abcdefghijklmnopqrstuvwxyz0123456789"]
    (d / "vocab.txt").write_text("\n".join(toks) + "\n")
    return d / "vocab.txt"
