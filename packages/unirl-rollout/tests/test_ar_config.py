"""Typed AR configs: validation errors name the field; build() gives a working pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from unirl.rollout.ar import CausalLMBundle
from unirl.rollout.ar.config import ARPipelineConfig, CausalLMConfig
from unirl.types import Sample, TextPrimitive


def test_tiny_config_builds_a_pipeline_that_samples() -> None:
    cfg = ARPipelineConfig.model_validate(
        {
            "sampling": {"max_new_tokens": 5, "temperature": 0.5},
            "model": {"tiny": {"max_position_embeddings": 64}},
        }
    )
    pipe = cfg.build()
    assert pipe.bundle.context_window == 64 and pipe.params.temperature == 0.5
    s = pipe.generate([Sample(id="a", group_id="g", inputs=[TextPrimitive(text="1+1=")])], rollout_step=0)[0]
    assert 1 <= len(s.part("ar").segment.response_ids) <= 5


def test_config_typos_and_bad_values_fail_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="max_new_token"):
        ARPipelineConfig.model_validate({"sampling": {"max_new_token": 5}})
    with pytest.raises(ValidationError, match="dtype"):
        CausalLMConfig.model_validate({"dtype": "fp8"})
    with pytest.raises(ValidationError, match="sync_every"):
        ARPipelineConfig.model_validate({"sampling": {"max_new_tokens": 5}, "sync_every": 0})
    with pytest.raises(ValidationError, match="prompt_template='Q:'"):
        ARPipelineConfig.model_validate({"sampling": {"max_new_tokens": 5}, "prompt_template": "Q:"})


def test_path_config_loads_a_saved_checkpoint(tmp_path: Path) -> None:
    CausalLMBundle.tiny_qwen3(seed=5).save_pretrained(tmp_path)
    bundle = CausalLMConfig(path=str(tmp_path), chat_template_kwargs={"x": 1}).build()
    assert bundle.chat_template_kwargs == {"x": 1}
    assert bundle.encode_prompt("2*2=") == CausalLMBundle.tiny_qwen3().encode_prompt("2*2=")
