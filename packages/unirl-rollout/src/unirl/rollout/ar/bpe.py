"""Real byte-level BPE tokenizers trained in code on a small corpus, in the style of a model family.

A hub checkpoint ships a ``tokenizer.json`` (byte-level BPE for Qwen2 / Qwen3 / Llama 3), its
special tokens and a Jinja chat template. Offline, ``train_bpe_tokenizer`` builds the same kind of
object: a ``tokenizers`` BPE model trained on ``corpus`` (byte-level pre-tokeniser and decoder, so
any text round-trips), the family's special tokens and chat template, wrapped in
``PreTrainedTokenizerFast``. ``save_pretrained`` writes ``tokenizer.json`` +
``tokenizer_config.json`` (with the template) that ``AutoTokenizer.from_pretrained`` reads back.

Families (special tokens and template as in the released instruct checkpoints, trimmed of tool
calls):
- ``qwen2``: ChatML (``<|im_start|>role\\n...<|im_end|>\\n``); eos ``<|im_end|>``, pad ``<|endoftext|>``.
- ``qwen3``: ChatML plus the empty think block when ``enable_thinking=False``; same specials.
- ``llama``: Llama 3 headers (``<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>``),
  BOS ``<|begin_of_text|>`` emitted by the template, eos ``<|eot_id|>``, no pad token (the bundle
  pads with eos, as for the real Llama 3).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

Family = Literal["qwen2", "qwen3", "llama"]

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)
_QWEN2 = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class FamilyTokens:
    """A family's special tokens and chat template."""

    specials: tuple[str, ...]
    eos: str
    pad: str | None
    bos: str | None
    chat_template: str
    extra_eos: tuple[str, ...] = ()
    """Further end tokens the family's generation config lists (Llama 3: ``<|end_of_text|>``)."""


FAMILIES: dict[str, FamilyTokens] = {
    "qwen2": FamilyTokens(
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        eos="<|im_end|>",
        pad="<|endoftext|>",
        bos=None,
        chat_template=_QWEN2,
        extra_eos=("<|endoftext|>",),
    ),
    "qwen3": FamilyTokens(
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        eos="<|im_end|>",
        pad="<|endoftext|>",
        bos=None,
        chat_template=_CHATML,
        extra_eos=("<|endoftext|>",),
    ),
    "llama": FamilyTokens(
        specials=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ),
        eos="<|eot_id|>",
        pad=None,
        bos="<|begin_of_text|>",
        chat_template=_LLAMA3,
        extra_eos=("<|end_of_text|>",),
    ),
}


def train_bpe_tokenizer(
    corpus: Iterable[str],
    *,
    family: Family = "qwen3",
    vocab_size: int = 400,
    extra_special_tokens: Iterable[str] = (),
) -> PreTrainedTokenizerFast:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``corpus`` with ``family``'s specials.

    Ids: the family's special tokens first, then ``extra_special_tokens`` (e.g. a VLM's
    ``<|image_pad|>``), then the 256 byte symbols and the learned merges, up to ``vocab_size``.
    No BOS / EOS is added on plain encode (the chat template writes them). Left padding.
    """
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is not one of {sorted(FAMILIES)}")
    fam = FAMILIES[family]
    specials = list(dict.fromkeys([*fam.specials, *extra_special_tokens]))
    texts = [t for t in corpus if t]
    if not texts:
        raise ValueError("corpus is empty; pass the texts the tokenizer should learn merges from")
    min_size = len(specials) + 256
    if vocab_size < min_size:
        raise ValueError(f"vocab_size={vocab_size} is below {min_size} (special tokens + 256 bytes)")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=fam.eos,
        pad_token=fam.pad,
        bos_token=fam.bos,
        additional_special_tokens=[s for s in specials if s not in (fam.eos, fam.pad, fam.bos)],
    )
    tok.chat_template = fam.chat_template
    tok.padding_side = "left"
    return tok


def family_eos_ids(tokenizer: PreTrainedTokenizerFast, family: Family) -> list[int]:
    """The end-of-turn id and the family's further end ids, for a model's ``generation_config``."""
    fam = FAMILIES[family]
    return [int(tokenizer.convert_tokens_to_ids(t)) for t in (fam.eos, *fam.extra_eos)]
