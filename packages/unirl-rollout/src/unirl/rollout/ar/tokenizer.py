"""A character-level tokenizer built in code, for tiny offline models (no hub download).

Every printable ASCII character is one token; the special tokens follow Qwen's chat format
(``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``). It is a real ``tokenizers`` tokenizer
wrapped in ``PreTrainedTokenizerFast``, so ``save_pretrained`` / ``AutoTokenizer.from_pretrained``
round-trip it like any hub tokenizer.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
BOS_TOKEN = "<|bos|>"
UNK_TOKEN = "<|unk|>"
IM_START = "<|im_start|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN)

# Qwen-style ChatML. The newlines are literal; no whitespace-trimming jinja markers.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

DEFAULT_CHARACTERS = "".join(sorted(set(string.printable) - set("\x0b\x0c\r")))


def build_char_tokenizer(
    characters: str = DEFAULT_CHARACTERS, *, chat_template: str | None = CHAT_TEMPLATE
) -> PreTrainedTokenizerFast:
    """A character-level ``PreTrainedTokenizerFast`` with pad / eos / bos / unk and a chat template.

    Ids: the five special tokens first (pad=0, ``<|im_start|>``=1, eos=``<|im_end|>``=2, bos=3,
    unk=4), then ``characters`` in the given order (duplicates dropped). No BOS is prepended on
    encode (Qwen convention). ``chat_template=None`` gives a plain-text tokenizer.
    """
    chars = list(dict.fromkeys(characters))
    if not chars:
        raise ValueError("characters='' gives an empty vocabulary; pass the characters the data uses")
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START],
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    tok.padding_side = "left"
    return tok
