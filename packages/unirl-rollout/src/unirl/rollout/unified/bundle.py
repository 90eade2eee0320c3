"""The ``UnifiedBundle`` protocol (one backbone, a text head and a flow-matching image head) and
the tiny in-project bundle that implements it.

Sequence layout the rollout pipelines and the replay path share::

    [BOS prompt... SEP] [plan... EOS] [image block: N latent tokens]
     prompt_ids          response_ids  (bidirectional; attends to all the text before it)

The text head scores the plan token by token (causal); the image head predicts the velocity of
the image latents conditioned on the whole text context (prompt + plan, ``context_conditions``).
A UnifiedBundle is also a ``FlowBundle`` (``predict_velocity(latents, sigma, conditions)``), so
the image track runs on ``FlowMatchPipeline``'s sampler and replay unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from unirl.rollout.models.base import from_uint8_images, to_uint8_images
from unirl.rollout.schedules import DynamicShiftSchedule
from unirl.rollout.unified.tiny import TinyUnifiedConfig, TinyUnifiedModel
from unirl.types import Conditions

__all__ = ["TinyUnifiedBundle", "UnifiedBundle", "WordVocab"]

CONTEXT_IDS, CONTEXT_MASK = "context_ids", "context_mask"
"""The image Part's conditions: the text context, right-padded to ``max_text_len`` (long / bool)."""


@runtime_checkable
class UnifiedBundle(Protocol):
    """A unified AR + flow-matching model as rollout and training see it (see the module docstring)."""

    @property
    def model(self) -> nn.Module:
        """The one trainable backbone (both heads); the train backend wraps it in place (read-only
        here, so a bundle may declare its own module class)."""
        ...

    dynamic_schedule: DynamicShiftSchedule
    embedded_guidance: bool
    eos_token_id: int
    pad_token_id: int
    max_text_len: int

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def encode_prompt(self, text: str) -> list[int]:
        """The prompt's ids, separators included (the text head continues after them)."""
        ...

    def encode_plan(self, text: str) -> list[int]:
        """A plan's ids without EOS (SFT targets; the sampler stops at EOS)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Plan text of ``ids`` (special tokens dropped)."""
        ...

    def text_logits(self, ids_BL: Tensor, mask_BL: Tensor) -> Tensor:
        """Next-token logits ``[B, L, V]`` fp32 of right-padded text (causal)."""
        ...

    def context_conditions(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> Conditions:
        """The image block's conditioning: the text context prompt + plan as padded ids and mask."""
        ...

    def frozen_modules(self) -> dict[str, nn.Module]: ...

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]: ...

    def image_seq_len(self, height: int, width: int) -> int: ...

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        """Velocity of ``latents`` [B, C, h, w] at ``sigma`` [B] given batched ``context_conditions``."""
        ...

    def encode_images(self, images_BHWC: Tensor) -> Tensor:
        """uint8 images -> latents (SFT targets)."""
        ...

    def decode_latents(self, latents: Tensor) -> Tensor:
        """Latents -> uint8 images [B, H, W, 3]."""
        ...


PAD, UNK, BOS, SEP, EOS = 0, 1, 2, 3, 4
_SPECIALS = ("<pad>", "<unk>", "<bos>", "<sep>", "<eos>")


class WordVocab:
    """Word-level vocabulary of a closed world: pad 0, unk 1, bos 2, sep 3, eos 4, words from 5."""

    def __init__(self, words: Sequence[str]) -> None:
        ws = list(dict.fromkeys(w.lower() for w in words))
        bad = [w for w in ws if len(w.split()) != 1 or w in _SPECIALS]
        if bad:
            raise ValueError(f"vocabulary words must be single words and not special tokens; got {bad[:5]}")
        self.words = ws
        self._ids = {w: i + len(_SPECIALS) for i, w in enumerate(ws)}

    def __len__(self) -> int:
        return len(self.words) + len(_SPECIALS)

    def encode(self, text: str) -> list[int]:
        return [self._ids.get(w, UNK) for w in text.lower().split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.words[i - len(_SPECIALS)] for i in ids if i >= len(_SPECIALS))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"words": self.words}, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> WordVocab:
        return cls(json.loads(path.read_text())["words"])


VOCAB_FILE = "vocab.json"


class TinyUnifiedBundle:
    """``TinyUnifiedModel`` + ``WordVocab``: the in-project ``UnifiedBundle`` over pixel latents."""

    eos_token_id, pad_token_id = EOS, PAD
    embedded_guidance = False

    def __init__(self, model: TinyUnifiedModel, vocab: WordVocab) -> None:
        if len(vocab) != model.config.vocab_size:
            raise ValueError(f"vocabulary has {len(vocab)} ids, the model {model.config.vocab_size}")
        self.model, self.vocab = model, vocab
        self.max_text_len = model.config.max_text_len
        self.dynamic_schedule = DynamicShiftSchedule(base_grid="scheduler")

    @classmethod
    def tiny(cls, words: Sequence[str], *, seed: int = 0, **sizes: object) -> TinyUnifiedBundle:
        """A seeded, randomly initialised bundle over ``words`` (``sizes``: TinyUnifiedConfig fields)."""
        vocab = WordVocab(words)
        config = TinyUnifiedConfig(vocab_size=len(vocab), **sizes)  # type: ignore[arg-type]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = TinyUnifiedModel(config)
        return cls(model, vocab)

    def save_pretrained(self, directory: str | Path) -> Path:
        d = self.model.save_pretrained(directory)
        self.vocab.save(d / VOCAB_FILE)
        return d

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, *, device: str | torch.device = "cpu"
    ) -> TinyUnifiedBundle:
        d = Path(directory)
        return cls(TinyUnifiedModel.from_pretrained(d, device=device), WordVocab.load(d / VOCAB_FILE))

    def to(self, device: torch.device | str) -> TinyUnifiedBundle:
        self.model.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # ---- text ---------------------------------------------------------------------------------
    def encode_prompt(self, text: str) -> list[int]:
        return [BOS, *self.vocab.encode(text), SEP]

    def encode_plan(self, text: str) -> list[int]:
        return self.vocab.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.vocab.decode(ids)

    def text_logits(self, ids_BL: Tensor, mask_BL: Tensor) -> Tensor:
        return self.model.text_logits(ids_BL.to(self.device), mask_BL.to(self.device))

    def context_conditions(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> Conditions:
        ids = [*prompt_ids, *response_ids]
        if len(ids) > self.max_text_len:
            raise ValueError(f"text context of {len(ids)} tokens > max_text_len={self.max_text_len}")
        ids_L = torch.full((self.max_text_len,), PAD, dtype=torch.long)
        ids_L[: len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask_L = torch.zeros(self.max_text_len, dtype=torch.bool)
        mask_L[: len(ids)] = True
        return Conditions(tensors={CONTEXT_IDS: ids_L, CONTEXT_MASK: mask_L})

    # ---- image (the FlowBundle view) ----------------------------------------------------------
    def frozen_modules(self) -> dict[str, nn.Module]:
        return {}

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        size = self.model.config.image_size
        if (height, width) != (size, size):
            raise ValueError(f"height={height}, width={width}: the model draws {size}x{size} images")
        return (self.model.config.image_channels, size, size)

    def image_seq_len(self, height: int, width: int) -> int:
        return self.model.config.image_tokens

    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        """Conditions of plain prompts with an empty plan (the image head without thinking)."""
        return [self.context_conditions(self.encode_prompt(t), [EOS]) for t in texts]

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        # the full padded width, always: rollout and replay then run kernels of one shape (ratio 1)
        return self.model.velocity(latents, sigma, conditions[CONTEXT_IDS], conditions[CONTEXT_MASK].bool())

    @torch.no_grad()
    def encode_images(self, images_BHWC: Tensor) -> Tensor:
        return from_uint8_images(images_BHWC).to(self.device)

    def decode_latents(self, latents: Tensor) -> Tensor:
        return to_uint8_images(latents)
