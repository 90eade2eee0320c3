"""Property-based API testing from the committed OpenAPI spec: no input makes the server answer 5xx."""

from __future__ import annotations

from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from reward_test_helpers import LengthScorer  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from unirl.reward.combine import WeightedScorer  # noqa: E402
from unirl.reward.server.app import create_app  # noqa: E402
from unirl.reward.server.runner import serve_in_thread  # noqa: E402
from unirl.reward.server.settings import ServerSettings  # noqa: E402

OPENAPI = Path(__file__).resolve().parents[1] / "openapi.json"
schema = schemathesis.openapi.from_path(OPENAPI)


@pytest.fixture(scope="module")
def base_url():
    app = create_app(
        lambda: [WeightedScorer("length", 1.0, LengthScorer())], ServerSettings(max_request_bytes=2**20)
    )
    with serve_in_thread(app) as h:
        yield h.url


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case, base_url):
    case.call_and_validate(
        base_url=base_url,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
        timeout=30,
    )
