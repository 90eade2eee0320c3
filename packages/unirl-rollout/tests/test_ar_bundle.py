"""The causal-LM bundle and the in-code character tokenizer: encode, chat template, save/load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from unirl.rollout.ar import CausalLMBundle, build_char_tokenizer
from unirl.rollout.ar.bundle import resolve_dtype


def test_char_tokenizer_ids_roundtrip_and_specials() -> None:
    tok = build_char_tokenizer("0123456789+= \n")
    # specials first: pad=0, <|im_start|>=1, eos=<|im_end|>=2, bos=3, unk=4, then the characters
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 2, 3, 4)
    assert len(tok) == 5 + 14
    ids = tok("12+3=\n\n", add_special_tokens=False)["input_ids"]
    assert ids == [6, 7, 15, 8, 16, 18, 18]  # one id per character; "\n\n" is two tokens
    assert tok.decode(ids) == "12+3=\n\n"
    assert tok.decode([*ids, 2], skip_special_tokens=True) == "12+3=\n\n"
    assert tok("x", add_special_tokens=False)["input_ids"] == [4]  # unknown character -> unk
    assert tok("<|im_end|>", add_special_tokens=False)["input_ids"] == [2]  # specials are atomic


def test_char_tokenizer_needs_characters() -> None:
    with pytest.raises(ValueError, match="characters=''"):
        build_char_tokenizer("")


def test_chat_template_and_plain_prompts() -> None:
    bundle = CausalLMBundle.tiny_qwen3()
    assert bundle.has_chat_template
    assert bundle.render_prompt("1+2") == "<|im_start|>user\n1+2<|im_end|>\n<|im_start|>assistant\n"
    ids = bundle.encode_prompt("1+2")
    assert ids[0] == bundle.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert bundle.tokenizer.decode(ids) == bundle.render_prompt("1+2")
    bundle.system_prompt = "be brief"
    assert bundle.render_prompt("1+2").startswith(
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n"
    )

    # extra template variables (Qwen3's enable_thinking, say) reach the template
    bundle.tokenizer.chat_template = "{% if greet %}HI {% endif %}{{ messages[-1]['content'] }}"
    assert bundle.render_prompt("q") == "q"
    bundle.chat_template_kwargs = {"greet": True}
    assert bundle.render_prompt("q") == "HI q"

    plain = CausalLMBundle.tiny_qwen3(chat_template=False)
    assert not plain.has_chat_template
    assert plain.render_prompt("1+2") == "1+2"
    assert plain.encode_prompt("1+2") == plain.tokenizer("1+2", add_special_tokens=False)["input_ids"]


def test_tiny_qwen3_shape_and_determinism() -> None:
    a = CausalLMBundle.tiny_qwen3(seed=3)
    b = CausalLMBundle.tiny_qwen3(seed=3)
    c = CausalLMBundle.tiny_qwen3(seed=4)
    assert type(a.model).__name__ == "Qwen3ForCausalLM"
    assert a.model.config.vocab_size == len(a.tokenizer)
    assert a.context_window == 256
    assert a.eos_token_ids == [a.tokenizer.eos_token_id]
    assert a.trainable_modules() == {"model": a.model} and a.frozen_modules() == {}
    sa, sb, sc = (x.model.state_dict() for x in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_save_and_load_through_from_pretrained(tmp_path: Path) -> None:
    bundle = CausalLMBundle.tiny_qwen3(seed=1)
    bundle.save_pretrained(tmp_path / "ckpt")
    loaded = CausalLMBundle.from_pretrained(tmp_path / "ckpt", dtype="float32")
    assert isinstance(loaded.tokenizer, PreTrainedTokenizerBase)
    assert loaded.encode_prompt("12+3=") == bundle.encode_prompt("12+3=")
    assert loaded.tokenizer.pad_token_id == bundle.tokenizer.pad_token_id
    assert loaded.eos_token_ids == bundle.eos_token_ids
    ids = torch.tensor([bundle.encode_prompt("7*8=")])
    with torch.no_grad():
        assert torch.equal(loaded.model(input_ids=ids).logits, bundle.model(input_ids=ids).logits)

    half = CausalLMBundle.from_pretrained(tmp_path / "ckpt", dtype="bfloat16")
    assert next(half.model.parameters()).dtype == torch.bfloat16


def test_dtype_errors_name_the_value() -> None:
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="dtype='fp8'"):
        resolve_dtype("fp8")
    with pytest.raises(ValueError, match="hidden_size=30"):
        CausalLMBundle.tiny_qwen3(hidden_size=30, num_heads=4)
