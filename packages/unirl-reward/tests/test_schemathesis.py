"""Property-based API testing from the spec a (token-protected) text-scoring server publishes:
no input makes it answer 5xx, answers match the spec, bodies the schema forbids are refused,
bodies it allows are never refused for their shape, and every secured operation needs the token.

The spec is `openapi_spec(["text"])`, which test_server_spec checks is what such a server
serves at GET /openapi.json (schemathesis' fixture loader does not run under pytest 9).
"""

from __future__ import annotations

import collections
import re

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from reward_test_helpers import LengthScorer  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.config._checks import NegativeDataRejectionConfig  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from unirl.reward.combine import WeightedScorer  # noqa: E402
from unirl.reward.server.app import create_app  # noqa: E402
from unirl.reward.server.openapi import openapi_spec  # noqa: E402
from unirl.reward.server.runner import serve_in_thread  # noqa: E402
from unirl.reward.server.settings import ServerSettings  # noqa: E402

TOKEN = "s3cret-token-value"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# WireItem requires what the deployment's one scorer (LengthScorer, modality "text") reads
# A body over max_request_bytes (413) is refused before anyone reads it, schema-valid or not.
REJECTED = [*NegativeDataRejectionConfig._DEFAULT_EXPECTED_STATUSES, "413"]
CONFIG = SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": REJECTED}}}
)
schema = schemathesis.openapi.from_dict(openapi_spec([LengthScorer.modality]), config=CONFIG)


def _refused_for_its_shape(detail: str) -> bool:
    """A 422 the schema could have predicted: a missing input or a structural validation error.

    Allowed for schema-valid bodies are refusals the schema cannot express: media that do not
    decode, base64 that is not, an array whose bytes do not fill its shape (pydantic "Value error").
    """
    if "needs item." in detail:  # a scorer's input check
        return True
    if not detail.startswith("invalid request: "):
        return False
    errors = re.split(r"; (?=body\.)", detail.removeprefix("invalid request: "))  # one per field
    return any("Value error" not in e for e in errors)


def schema_valid_bodies_are_not_refused_for_their_shape(ctx, response, case):
    if case.meta is not None and case.meta.generation.mode.is_positive and response.status_code == 422:
        detail = response.json()["detail"]
        assert not _refused_for_its_shape(detail), (
            f"the schema allows this body, the server refused: {detail}"
        )


STATUSES: collections.Counter[tuple[str, int]] = collections.Counter()  # (operation, status) -> count


def count_status(ctx, response, case):
    STATUSES[(f"{case.method} {case.path}", response.status_code)] += 1


@pytest.fixture(scope="module")
def base_url():
    app = create_app(
        lambda: [WeightedScorer("length", 1.0, LengthScorer())],
        ServerSettings(max_request_bytes=2**20),
        token=TOKEN,
    )
    with serve_in_thread(app) as h:
        yield h.url
    if STATUSES:  # the figure of docs/reliability.md (shown with pytest -s)
        by_status = collections.Counter()
        for (_, status), n in STATUSES.items():
            by_status[status] += n
        paths = sorted({op.split()[1] for op, _ in STATUSES})
        methods = {op.split()[0] for op, _ in STATUSES}
        print(
            f"\nschemathesis: {sum(STATUSES.values())} requests to {len(paths)} paths ({', '.join(paths)}) "
            f"with {len(methods)} methods; by status: {dict(sorted(by_status.items()))}"
        )


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_server_keeps_its_published_contract(case, base_url):
    case.call_and_validate(
        base_url=base_url,
        headers=AUTH,
        checks=[
            count_status,
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            negative_data_rejection,
            ignored_auth,
            schema_valid_bodies_are_not_refused_for_their_shape,
        ],
        timeout=30,
    )


@pytest.mark.parametrize(
    ("detail", "refused"),
    [
        ("scorer 'length' (modality 'text') needs item.response, but item 0 has none", True),
        ("invalid request: body.items.0.response: Input should be a valid string", True),
        ("invalid request: body.items.0.image.array: Value error, data has 3 bytes but shape", False),
        (
            "invalid request: body.items.0.image.encoded.data: Value error, not valid base64 (x); encode",
            False,
        ),
        (
            "invalid request: body.items.0.image.array.data: Value error, x; body.items.1: Field required",
            True,
        ),
        ("items.0: cannot decode the image", False),
    ],
)
def test_shape_refusals_are_told_apart(detail, refused):
    assert _refused_for_its_shape(detail) is refused
