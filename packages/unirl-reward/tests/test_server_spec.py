"""The server and its OpenAPI spec agree: a body the schema allows is scored, one it forbids is
refused, and an error has the content type and shape the spec declares for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from reward_test_helpers import LengthScorer

from unirl.reward.combine import WeightedScorer
from unirl.reward.media import encode_image
from unirl.reward.server.app import create_app
from unirl.reward.server.openapi import openapi_spec
from unirl.reward.server.runner import serve_in_thread

jsonschema = pytest.importorskip("jsonschema")

OPENAPI = Path(__file__).resolve().parents[1] / "openapi.json"
TOKEN = "s3cret-token-value"
PNG = encode_image(np.zeros((4, 4, 3), np.uint8)).model_dump(mode="json")


def _validator(spec: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A JSON Schema 2020-12 validator (OpenAPI 3.1's dialect) resolving refs into the spec."""
    return jsonschema.Draft202012Validator({**schema, "components": spec["components"]})


def _request_validator(spec: dict[str, Any]) -> Any:
    return _validator(spec, {"$ref": "#/components/schemas/ScoreRequest"})


@pytest.fixture(scope="module")
def text_server():
    """A deployment whose one scorer reads `response` (modality "text")."""
    with serve_in_thread(create_app(lambda: [WeightedScorer("length", 1.0, LengthScorer())])) as h:
        yield h.url


@pytest.mark.parametrize(
    "item", [{}, {"prompt": "p", "metadata": {"a": 1}}, {"response": None}, {"image": None, "video": None}]
)
def test_committed_schema_refuses_an_item_no_scorer_can_read(item):
    # every modality reads response, image or video, and a server has at least one scorer
    assert not _request_validator(json.loads(OPENAPI.read_text())).is_valid({"items": [item]})


@pytest.mark.parametrize(
    "item", [{"response": "x"}, {"image": PNG}, {"video": {"kind": "frames", "frames": [PNG]}}]
)
def test_committed_schema_allows_an_item_some_scorer_can_read(item):
    assert _request_validator(json.loads(OPENAPI.read_text())).is_valid({"items": [item]})


@pytest.mark.parametrize(
    "item",
    [
        {},
        {"prompt": "p"},
        {"response": None},
        {"image": PNG},  # fine for an image scorer, but this deployment reads text
        {"response": "x"},
        {"response": "", "prompt": "p", "reference": "r", "metadata": {"k": [1, "a", True, 0.5]}},
        {"response": "x", "image": PNG},
    ],
)
def test_live_schema_allows_exactly_what_the_deployment_scores(text_server, item):
    spec = httpx.get(text_server + "/openapi.json").json()
    body = {"items": [item]}
    r = httpx.post(text_server + "/v1/score", json=body)
    assert _request_validator(spec).is_valid(body) == (r.status_code == 200), r.text


def test_live_schema_only_narrows_the_committed_one(text_server):
    live, committed = httpx.get(text_server + "/openapi.json").json(), json.loads(OPENAPI.read_text())
    assert live == openapi_spec(["text"])  # what test_schemathesis generates from
    assert live["components"]["schemas"]["WireItem"]["required"] == ["response"]
    for spec in (live, committed):
        del spec["components"]["schemas"]["WireItem"]
    assert live == committed


def test_declared_errors_match_what_the_server_sends():
    spec = json.loads(OPENAPI.read_text())
    with serve_in_thread(
        create_app(lambda: [WeightedScorer("length", 1.0, LengthScorer())], token=TOKEN)
    ) as h:
        secured = [
            (p, m, op) for p, ops in spec["paths"].items() for m, op in ops.items() if op.get("security")
        ]
        assert {p for p, _, _ in secured} == {"/v1/score", "/v1/version", "/metrics"}
        for path, method, op in secured:
            r = httpx.request(method, h.url + path, json={"items": [{"response": "x"}]})
            assert r.status_code == 401, path
            declared = op["responses"]["401"]["content"]
            media_type = r.headers["content-type"].split(";")[0]
            assert media_type in declared, f"{path}: sent {media_type}, the spec declares {list(declared)}"
            _validator(spec, declared[media_type]["schema"]).validate(r.json())
