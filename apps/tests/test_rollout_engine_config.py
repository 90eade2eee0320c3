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


def test_ray_layout_takes_vllm_but_not_one_attached_server_for_several_workers() -> None:
    vllm = recipe(rollout={"engine": {"kind": "vllm"}})
    check_layout(vllm, LayoutConfig(kind="ray", rollout_workers=2))  # each worker starts its own engine
    attached = recipe(rollout={"engine": {"kind": "vllm", "mode": "server", "url": "http://127.0.0.1:8000"}})
    check_layout(attached, LayoutConfig(kind="ray", rollout_workers=1))
    with pytest.raises(ValueError, match="cannot share one attached vLLM server"):
        check_layout(attached, LayoutConfig(kind="ray", rollout_workers=2))
    check_layout(recipe(), LayoutConfig(kind="ray", rollout_workers=2))  # trainside: any number
