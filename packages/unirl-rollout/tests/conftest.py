"""Shared fixtures: one tiny random SD3 bundle per test session (built in code, no hub)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sd3_bundle():  # type: ignore[no-untyped-def]
    from unirl.rollout.models.sd3 import SD3Bundle

    return SD3Bundle.tiny(seed=0)


@pytest.fixture(scope="session")
def flux_bundle():  # type: ignore[no-untyped-def]
    from unirl.rollout.models.flux import FluxBundle

    return FluxBundle.tiny(seed=0)
