"""The typed capabilities the apps wire algorithms by (``kl_weight`` / ``needs_reference``,
``sampling_overrides()``, ``UsesReference``, ``UsesOldPolicy``, ``ShapesRewards``): every config of
the ``AlgorithmConfig`` union answers them, and a config that asks for a reference policy builds an
algorithm that can take one."""

from __future__ import annotations

import typing

import pytest
from pydantic import TypeAdapter

from unirl.train.algorithms import (
    AlgorithmConfig,
    ShapesRewards,
    UsesOldPolicy,
    UsesReference,
)

CONFIGS = typing.get_args(typing.get_args(AlgorithmConfig)[0])
KL_KINDS = {"flow_grpo", "dance_grpo", "mix_grpo", "diffusion_nft", "grpo", "gspo", "drpo"}


def config(kind: str, **fields: object):
    return TypeAdapter(AlgorithmConfig).validate_python({"kind": kind, **fields})


def kinds() -> list[str]:
    return [typing.get_args(c.model_fields["kind"].annotation)[0] for c in CONFIGS]


def test_union_is_covered() -> None:
    assert len(kinds()) == 10 and set(kinds()) > KL_KINDS


@pytest.mark.parametrize("kind", kinds())
def test_no_kl_term_by_default(kind: str) -> None:
    cfg = config(kind)
    assert cfg.kl_weight == 0.0 and not cfg.needs_reference


@pytest.mark.parametrize("kind", sorted(KL_KINDS))
def test_kl_coef_is_the_kl_weight_and_needs_a_reference(kind: str) -> None:
    cfg = config(kind, kl_coef=0.25)
    assert cfg.kl_weight == 0.25 and cfg.needs_reference
    assert isinstance(cfg.build(), UsesReference)


@pytest.mark.parametrize("kind", sorted(set(kinds()) - KL_KINDS))
def test_configs_without_a_kl_term_reject_kl_coef(kind: str) -> None:
    with pytest.raises(ValueError, match="kl_coef"):
        config(kind, kl_coef=0.25)


def test_sampling_overrides() -> None:
    assert config("flow_grpo").sampling_overrides() == {}
    assert config("grpo").sampling_overrides() == {}
    assert config("dance_grpo").sampling_overrides()  # its SDE strategy


def test_optional_algorithm_capabilities() -> None:
    assert {k for k in kinds() if isinstance(config(k).build(), UsesOldPolicy)} == {"diffusion_nft"}
    assert {k for k in kinds() if isinstance(config(k).build(), ShapesRewards)} == {"grpo"}
