"""The causal-LM families the AR bundle names: config classes, and checks of a checkpoint directory.

``model.family`` in a recipe pins what a checkpoint must be (its ``config.json`` ``model_type``);
``check_checkpoint_dir`` turns the usual loading mistakes (a wrong path, a directory without a
``config.json`` or without tokenizer files, a checkpoint of another family) into errors that say
what was found and how to fix it, before transformers fails with a less direct message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from transformers import PretrainedConfig

Family = Literal["qwen2", "qwen3", "llama", "qwen2_5_vl"]

MODEL_TYPES: dict[str, str] = {
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "llama": "llama",
    "qwen2_5_vl": "qwen2_5_vl",
}
"""family -> the ``model_type`` of its ``config.json``."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def _looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id (``org/name`` has one slash and no leading ``.``/``/``)."""
    return path.startswith(("/", ".", "~")) or path.count("/") != 1 or Path(path).exists()


def check_checkpoint_dir(
    path: str | Path, *, family: str | None = None, tokenizer_path: str | Path | None = None
) -> None:
    """Raise a clear error when ``path`` cannot be the checkpoint asked for; hub ids pass through.

    FileNotFoundError: ``path`` (or ``tokenizer_path``) does not exist, has no ``config.json``, or
    holds no tokenizer files while no ``tokenizer_path`` is given. ValueError: its ``model_type``
    is not ``family``'s.
    """
    text = str(path)
    if family is not None and family not in MODEL_TYPES:
        raise ValueError(f"model.family={family!r} is not one of {sorted(MODEL_TYPES)}")
    if not _looks_local(text):
        return
    root = Path(text).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"model.path={text!r} is not a directory; pass a local checkpoint directory (with "
            "config.json, the weights and the tokenizer files) or a hub id 'org/name'"
        )
    config_file = root / "config.json"
    if not config_file.is_file():
        found = sorted(p.name for p in root.iterdir())[:10]
        raise FileNotFoundError(
            f"model.path={text!r} has no config.json (found {found}); point it at the directory "
            "save_pretrained wrote"
        )
    tok_root = root if tokenizer_path is None else Path(str(tokenizer_path)).expanduser()
    if tokenizer_path is not None and _looks_local(str(tokenizer_path)) and not tok_root.is_dir():
        raise FileNotFoundError(f"model.tokenizer_path={str(tokenizer_path)!r} is not a directory")
    if (tokenizer_path is None or tok_root.is_dir()) and not any(
        (tok_root / f).is_file() for f in TOKENIZER_FILES
    ):
        where = "model.path" if tokenizer_path is None else "model.tokenizer_path"
        raise FileNotFoundError(
            f"{where}={str(tok_root)!r} has no tokenizer (none of {list(TOKENIZER_FILES)}); save the "
            "tokenizer there (tokenizer.save_pretrained) or set model.tokenizer_path to a directory that has one"
        )
    if family is not None:
        model_type = json.loads(config_file.read_text()).get("model_type")
        if model_type != MODEL_TYPES[family]:
            raise ValueError(
                f"model.path={text!r} is a {model_type!r} checkpoint (config.json model_type) but "
                f"model.family={family!r} expects {MODEL_TYPES[family]!r}; fix model.family or the path"
            )


def tiny_config(family: str, *, vocab_size: int, **sizes: Any) -> PretrainedConfig:
    """A small transformers config of ``family`` (``qwen2`` | ``qwen3`` | ``llama``), for tests.

    ``sizes`` override: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, max_position_embeddings, tie_word_embeddings, token ids.
    """
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    classes: dict[str, type[PretrainedConfig]] = {
        "qwen2": Qwen2Config,
        "qwen3": Qwen3Config,
        "llama": LlamaConfig,
    }
    if family not in classes:
        raise ValueError(f"family={family!r}: tiny causal LMs exist for {sorted(classes)}")
    kw: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    kw.update(sizes)
    if family == "qwen3":
        kw.setdefault("head_dim", kw["hidden_size"] // kw["num_attention_heads"])
    return classes[family](**kw)
