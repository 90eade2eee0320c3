"""Qwen2 / Qwen3 / Llama causal LMs with real BPE tokenizers and chat templates, through the
bundle's real loader (``save_pretrained`` to a directory, ``from_pretrained`` back): the chat
template as transformers applies it, EOS / pad handling, rollout/replay parity, loading errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from unirl.rollout.ar import ARPipeline, CausalLMBundle, behavior_logprobs
from unirl.rollout.ar.bpe import family_eos_ids, train_bpe_tokenizer
from unirl.rollout.ar.config import CausalLMConfig
from unirl.rollout.ar.families import tiny_config
from unirl.types import ARSamplingParams, Sample, TextPrimitive

CORPUS = [
    "What is 12 plus 7? The answer is 19.",
    "Tom has 3 apples and buys 5 more. How many apples does Tom have now? 8",
    "A red circle is left of a blue square.",
    "You are a helpful assistant. Answer with just the final number.",
] * 4
PROMPTS = ["What is 3 plus 4?", "Tom has 2 apples.", "A red circle?", "12 plus 7"]
CLASSES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


def save_family(family: str, root: Path, *, seed: int = 0, with_tokenizer: bool = True) -> Path:
    """A tiny random ``family`` model and a BPE tokenizer trained on CORPUS, saved as a hub checkpoint."""
    tok = train_bpe_tokenizer(CORPUS, family=family, vocab_size=320)  # type: ignore[arg-type]
    eos = family_eos_ids(tok, family)  # type: ignore[arg-type]
    cfg = tiny_config(
        family, vocab_size=len(tok), eos_token_id=eos[0], pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(root)
    if with_tokenizer:
        tok.save_pretrained(root)
    return root


@pytest.fixture(scope="module", params=sorted(CLASSES))
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    torch.set_num_threads(1)
    family = str(request.param)
    return family, save_family(family, tmp_path_factory.mktemp(family))


def hf_template_ids(root: Path, messages: list[dict[str, str]], **kwargs: Any) -> list[int]:
    """transformers' own rendering + tokenisation of the chat, from a freshly loaded tokenizer."""
    tok = AutoTokenizer.from_pretrained(str(root))
    out = tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )
    return list(out)


def test_loads_family_with_its_chat_template_and_special_tokens(family_dir: tuple[str, Path]) -> None:
    family, root = family_dir
    bundle = CausalLMBundle.from_pretrained(root, family=family)
    assert type(bundle.model).__name__ == CLASSES[family]
    assert (root / "tokenizer.json").is_file() and bundle.has_chat_template
    user = [{"role": "user", "content": "What is 3 plus 4?"}]
    assert bundle.encode_prompt("What is 3 plus 4?") == hf_template_ids(root, user)
    bundle.system_prompt = "Answer with just the final number."
    assert bundle.encode_prompt("What is 3 plus 4?") == hf_template_ids(
        root, [{"role": "system", "content": bundle.system_prompt}, *user]
    )
    tok = bundle.tokenizer
    ids = bundle.encode_prompt("What is 3 plus 4?")
    if family == "llama":  # the template writes BOS; encoding must not add a second one
        assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
        assert tok.pad_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|eot_id|>")
    else:
        assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
        assert tok.pad_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>"
    # eos of the tokenizer first, then the generation config's further end ids
    assert bundle.eos_token_ids == family_eos_ids(tok, family)  # type: ignore[arg-type]
    assert len(bundle.eos_token_ids) == 2
    assert bundle.decode(
        [*tok("19 apples", add_special_tokens=False)["input_ids"], bundle.eos_token_ids[0]]
    ) == ("19 apples")


def test_qwen3_template_variables_reach_the_template(tmp_path: Path) -> None:
    root = save_family("qwen3", tmp_path)
    cfg = CausalLMConfig(path=str(root), family="qwen3", chat_template_kwargs={"enable_thinking": False})
    bundle = cfg.build()
    user = [{"role": "user", "content": "12 plus 7"}]
    ids = bundle.encode_prompt("12 plus 7")
    assert ids == hf_template_ids(root, user, enable_thinking=False)
    assert ids != hf_template_ids(root, user)
    assert bundle.render_prompt("12 plus 7").endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_rollout_replay_first_update_ratio_is_one(family_dir: tuple[str, Path]) -> None:
    family, root = family_dir
    bundle = CausalLMBundle.from_pretrained(root, family=family)
    # stop on a token the random model emits often, so rows end at different lengths
    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=12, temperature=0.9, top_k=50), sync_every=4)
    samples = [
        Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text=t)]) for i, t in enumerate(PROMPTS)
    ]
    parts = [s.part("ar") for s in pipe.generate(samples, rollout_step=2)]
    assert all(p.segment.prompt_ids == bundle.encode_prompt(t) for p, t in zip(parts, PROMPTS))
    assert all(p.text == bundle.decode(p.segment.response_ids) for p in parts)
    with torch.no_grad():
        replay = pipe.replay_logprobs(parts)
    old_logprobs = behavior_logprobs(parts)
    ratio = torch.exp(replay.logp - old_logprobs)[replay.mask]
    assert ratio.numel() == sum(len(p.segment.response_ids) for p in parts) > 0
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0), (ratio - 1).abs().max()


def test_loading_errors_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        CausalLMBundle.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        CausalLMBundle.from_pretrained(tmp_path / "empty")
    bare = save_family("qwen2", tmp_path / "bare", with_tokenizer=False)
    with pytest.raises(FileNotFoundError, match="has no tokenizer"):
        CausalLMBundle.from_pretrained(bare)
    llama = save_family("llama", tmp_path / "llama")
    with pytest.raises(ValueError, match="is a 'llama' checkpoint .* model.family='qwen3'"):
        CausalLMConfig(path=str(llama), family="qwen3").build()
    # the tokenizer from elsewhere: the bare model loads with the llama directory's tokenizer
    ok = CausalLMBundle.from_pretrained(bare, tokenizer_path=llama)
    assert type(ok.model).__name__ == "Qwen2ForCausalLM" and ok.tokenizer.eos_token == "<|eot_id|>"
