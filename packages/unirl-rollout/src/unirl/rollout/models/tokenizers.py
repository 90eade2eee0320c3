"""Tiny offline tokenizers for tests and the embedded default (no hub download).

A word-level ``PreTrainedTokenizerFast`` over a fixed vocabulary, wrapping every text as
``<s> words </s>`` and padding with ``<pad>``: enough for the CLIP and T5 slots of a tiny model.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

__all__ = ["DEFAULT_WORDS", "SPECIAL_TOKENS", "tiny_word_tokenizer"]

SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")
"""ids 0..3: pad, unk, bos, eos (eos is 3, not 2: CLIP treats eos_token_id == 2 as a legacy config)."""

DEFAULT_WORDS: tuple[str, ...] = tuple(
    " ".join(
        [
            "a an the of and on in at with to is are one two three four five six seven eight nine ten",
            "red green blue yellow orange purple pink brown black white gray",
            "circle square triangle star heart cross shape shapes dot dots ring box",
            "left right top bottom center middle above below next big small large tiny photo picture image",
        ]
    ).split()
)


def tiny_word_tokenizer(
    words: Iterable[str] = DEFAULT_WORDS, model_max_length: int = 16
) -> PreTrainedTokenizerFast:
    """A lower-casing, whitespace-split, word-level tokenizer; unknown words map to ``<unk>``."""
    vocab: dict[str, int] = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for w in words:
        vocab.setdefault(w.lower(), len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))

    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=model_max_length,
    )
