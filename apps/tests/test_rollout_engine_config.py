"""`rollout.engine` in an AR recipe: a discriminated union chosen by config, checked at load time."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from unirl.apps.distributed.layout import LayoutConfig, check_layout
from unirl.apps.trainers.ar_config import Recipe, TrainsideEngineConfig
from unirl.rollout.engines.vllm_config import VLLMEngineConfig


def recipe(**extra: Any) -> Recipe:
    base: dict[str, Any] = {
        "model": {"kind": "causal_lm"},
        "data": {"kind": "arithmetic"},
        "sampling": {"max_new_tokens": 4},
        "backend": {"optimizer": {"lr": 1e-3}},
        "reward": {"scorers": [{"name": "exact", "scorer": {"kind": "arithmetic"}}]},
        "sft": {"steps": 1, "batch_size": 2},
    }
    return Recipe.model_validate(base | extra)


def test_default_is_trainside_and_vllm_is_selected_by_kind() -> None:
    assert isinstance(recipe().rollout.engine, TrainsideEngineConfig)
    cfg = recipe(rollout={"engine": {"kind": "vllm", "mode": "server", "max_num_seqs": 8}}).rollout.engine
    assert isinstance(cfg, VLLMEngineConfig) and cfg.mode == "server" and cfg.max_num_seqs == 8


def test_unknown_kind_and_typos_name_the_options() -> None:
    with pytest.raises(ValidationError, match="trainside.*vllm|'trainside', 'vllm'"):
        recipe(rollout={"engine": {"kind": "vlm"}})
    with pytest.raises(ValidationError, match="max_num_seq"):
        recipe(rollout={"engine": {"kind": "vllm", "max_num_seq": 8}})
    with pytest.raises(ValidationError, match="only apply to mode='server'"):
        recipe(rollout={"engine": {"kind": "vllm", "url": "http://127.0.0.1:8000"}})


def test_vllm_with_lora_is_rejected_at_load_time() -> None:
    with pytest.raises(ValidationError, match="backend.lora is not supported"):
        recipe(
            rollout={"engine": {"kind": "vllm"}},
            backend={"optimizer": {"lr": 1e-3}, "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj"]}},
        )


def test_ray_layout_rejects_a_dedicated_engine() -> None:
    r = recipe(rollout={"engine": {"kind": "vllm"}})
    with pytest.raises(ValueError, match="layout.kind='single'"):
        check_layout(r, LayoutConfig(kind="ray"))
    check_layout(recipe(), LayoutConfig(kind="ray"))  # trainside stays allowed
