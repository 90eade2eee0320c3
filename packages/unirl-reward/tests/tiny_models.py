"""Tiny random-weight models built in code and saved as local from_pretrained folders (no hub)."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = [
    "a",
    "red",
    "blue",
    "green",
    "cube",
    "ball",
    "cat",
    "dog",
    "photo",
    "of",
    "two",
    "the",
    "left",
    "sign",
    "says",
]


def _clip_tokenizer(d: Path):
    from transformers import CLIPTokenizer

    # id 0 is a filler: OwlViT treats a query whose first id is 0 as padding
    vocab = {"!": 0, "<|startoftext|>": 1, "<|endoftext|>": 2}
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
        text_config=dict(
            vocab_size=n,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=40,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
        ),
        vision_config=dict(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
        ),
        projection_dim=projection_dim,
    )
    out = root / "clip"
    CLIPModel(cfg).save_pretrained(out)
    CLIPProcessor(image_processor=ip, tokenizer=tok).save_pretrained(out)
    return out


def bert_vocab(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    toks = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "[DEC]",
        "[ENC]",
        *WORDS,
        *"abcdefghijklmnopqrstuvwxyz0123456789",
    ]
    (d / "vocab.txt").write_text("\n".join(toks) + "\n")
    return d / "vocab.txt"


def tiny_blip_imagereward(root: Path) -> Path:
    """BlipForImageTextRetrieval (width 32) + BlipProcessor + a random mlp.safetensors head."""
    import torch
    from safetensors.torch import save_file
    from transformers import (
        BertTokenizer,
        BlipConfig,
        BlipForImageTextRetrieval,
        BlipImageProcessor,
        BlipProcessor,
    )

    from unirl.reward.models.mlp_head import build_head

    torch.manual_seed(0)
    vocab = bert_vocab(root / "blip_tok")
    tok = BertTokenizer(str(vocab))
    n = len(vocab.read_text().split())
    cfg = BlipConfig(
        text_config=dict(
            vocab_size=n,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            encoder_hidden_size=32,
            max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=2,
            sep_token_id=3,
        ),
        vision_config=dict(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
        ),
        projection_dim=16,
    )
    out = root / "imagereward"
    BlipForImageTextRetrieval(cfg).save_pretrained(out)
    BlipProcessor(
        image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok
    ).save_pretrained(out)
    save_file(
        {k: v.contiguous() for k, v in build_head(32).state_dict().items()}, str(out / "mlp.safetensors")
    )
    return out


def tiny_trocr(root: Path) -> Path:
    """VisionEncoderDecoderModel (ViT encoder + TrOCR decoder, width 32) + TrOCRProcessor."""
    import torch
    from transformers import (
        BertTokenizer,
        TrOCRConfig,
        TrOCRProcessor,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
    )

    torch.manual_seed(0)
    vocab = bert_vocab(root / "ocr_tok")
    tok = BertTokenizer(str(vocab))
    n = len(vocab.read_text().split())
    enc = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
    )
    dec = TrOCRConfig(
        vocab_size=n,
        d_model=32,
        decoder_layers=2,
        decoder_attention_heads=2,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        decoder_start_token_id=2,
    )
    cfg = VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cfg.decoder_start_token_id, cfg.pad_token_id, cfg.eos_token_id = 2, 0, 3
    model = VisionEncoderDecoderModel(cfg)
    model.generation_config.decoder_start_token_id = 2
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 3
    out = root / "trocr"
    model.save_pretrained(out)
    TrOCRProcessor(
        image_processor=ViTImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok
    ).save_pretrained(out)
    return out


def tiny_owlvit(root: Path) -> Path:
    """OwlViTForObjectDetection (width 32, 32x32 images) + OwlViTProcessor."""
    import torch
    from transformers import OwlViTConfig, OwlViTForObjectDetection, OwlViTImageProcessor, OwlViTProcessor

    torch.manual_seed(0)
    tok, n = _clip_tokenizer(root / "owl_tok")
    cfg = OwlViTConfig(
        text_config=dict(
            vocab_size=n,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=16,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
        ),
        vision_config=dict(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
        ),
        projection_dim=32,  # OwlViT queries need projection_dim == text width
    )
    out = root / "owlvit"
    OwlViTForObjectDetection(cfg).save_pretrained(out)
    ip = OwlViTImageProcessor(size={"height": 32, "width": 32}, crop_size={"height": 32, "width": 32})
    OwlViTProcessor(image_processor=ip, tokenizer=tok).save_pretrained(out)
    return out
