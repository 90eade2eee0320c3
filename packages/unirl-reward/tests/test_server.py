"""The reward server on real uvicorn (loopback, free port): endpoints, limits, auth, idempotency."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from reward_test_helpers import GatedScorer, LengthScorer

from unirl.reward.cli import main as cli_main
from unirl.reward.client import RetryPolicy, RewardClient, RewardClientError
from unirl.reward.combine import WeightedScorer
from unirl.reward.protocol import ScoreItem
from unirl.reward.server.app import create_app
from unirl.reward.server.openapi import openapi_spec
from unirl.reward.server.runner import serve_in_thread
from unirl.reward.server.settings import ServerSettings

OPENAPI = Path(__file__).resolve().parents[1] / "openapi.json"
TOKEN = "s3cret-token-value"


def _serve(scorer, token=None, **settings):
    app = create_app(lambda: [WeightedScorer("length", 2.0, scorer)], ServerSettings(**settings), token)
    return serve_in_thread(app)


@pytest.fixture(scope="module")
def server():
    scorer = LengthScorer()
    with _serve(scorer, max_request_bytes=4096) as h:
        yield h, scorer


def test_score_health_ready_version(server):
    h, _ = server
    assert httpx.get(h.url + "/health").json() == {"status": "ok"}
    assert httpx.get(h.url + "/ready").status_code == 200
    r = httpx.post(h.url + "/v1/score", json={"items": [{"response": "abc"}, {"response": ""}]})
    assert r.status_code == 200, r.text
    body = r.json()
    # weight 2.0 x len: 6.0 and 0.0; the component is the unweighted scorer total
    assert [x["total"] for x in body["results"]] == [6.0, 0.0]
    assert body["results"][0]["components"] == {"length": 3.0}
    v = httpx.get(h.url + "/v1/version").json()
    assert v["identity"] == body["identity"] and v["scorers"][0]["weight"] == 2.0


@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        (b"{not json", 422, "JSON"),
        (b'{"items": []}', 422, "items"),
        (b'{"items": [{"respnse": "x"}]}', 422, "respnse"),
        (b'{"items": [{}]}', 422, "needs item.response"),
        (b'{"items": [{"response": 5}]}', 422, "response"),
        (
            b'{"items": [{"response": "x", "image": {"kind": "encoded", "format": "png", "data": "AAAA"}}]}',
            422,
            "cannot decode",
        ),
        (b'{"items": [{"response": "x"}], "request_id": "a b"}', 422, "request_id"),
        (b"[]", 422, "invalid request"),
        (b"6\xff\xfe", 400, "UTF-8 JSON"),
        (b'{"items": [{"response": "' + b"x" * 5000 + b'"}]}', 413, "max_request_bytes"),
    ],
)
def test_malformed_payloads_get_4xx_with_message(server, payload, status, needle):
    h, _ = server
    r = httpx.post(h.url + "/v1/score", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]
    _serves_a_good_request(h)


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        (b'{"items": [{"response": "x", "metadata": {"x": NaN}}]}', "items.0.metadata.x"),
        (b'{"items": [{"response": "x", "metadata": {"x": -Infinity}}]}', "items.0.metadata.x"),
        (b'{"items": [{"response": "x", "metadata": {"x": 1e999}}]}', "items.0.metadata.x"),
        (
            b'{"items": [{"response": "x"}, {"response": "x", "metadata": {"x": [1, NaN]}}]}',
            "items.1.metadata.x.1",
        ),
        # a duplicate key keeps only its last value in Python, but the NaN was still sent
        (b'{"items": [{"response": "x", "metadata": {"x": -1e999, "x": 1}}]}', "items.0.metadata.x"),
        (b'{"items": [{"response": "x"}], "extra": Infinity}', "extra"),
    ],
)
def test_non_finite_numbers_anywhere_get_422_naming_the_path(server, payload, path):
    h, _ = server
    r = httpx.post(h.url + "/v1/score", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert f"body.{path}: Input should be a finite number" in r.json()["detail"]
    _serves_a_good_request(h)


def _serves_a_good_request(h) -> None:
    r = httpx.post(h.url + "/v1/score", json={"items": [{"response": "abc"}]})
    assert r.status_code == 200 and r.json()["results"][0]["total"] == 6.0, r.text


def test_finite_numbers_in_metadata_are_accepted(server):
    h, _ = server
    meta = b'{"a": 1.5, "b": [1e308, -0.0, 2], "c": -1.7976931348623157e308}'
    r = httpx.post(
        h.url + "/v1/score",
        content=b'{"items": [{"response": "x", "metadata": ' + meta + b"}]}",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200, r.text


def test_streamed_body_over_limit_is_413(server):
    h, _ = server

    def chunks():
        for _ in range(10):
            yield b"x" * 1000

    r = httpx.post(h.url + "/v1/score", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_retried_request_id_is_not_double_counted(server):
    h, scorer = server
    before = scorer.scored
    with RewardClient(h.url) as c:
        first = c.score_response([ScoreItem(response="ab")] * 3, request_id="req-1")
        again = c.score_response([ScoreItem(response="ab")] * 3, request_id="req-1")
        assert not first.cached and again.cached and again.results == first.results
        assert scorer.scored - before == 3
        with pytest.raises(RewardClientError, match="different body") as e:
            c.score([ScoreItem(response="zz")], request_id="req-1")
        assert e.value.status == 409
    metrics = httpx.get(h.url + "/metrics").text
    assert "unirl_reward_idempotent_hits_total 1" in metrics


def test_concurrent_requests_are_batched_together():
    scorer = GatedScorer()
    with _serve(scorer, max_batch=16, max_wait_ms=50) as h, ThreadPoolExecutor(8) as pool:
        first = pool.submit(httpx.post, h.url + "/v1/score", json={"items": [{"response": "x"}]}, timeout=30)
        assert scorer.entered.wait(10)  # batch 1 (one item) is inside the scorer
        rest = [
            pool.submit(httpx.post, h.url + "/v1/score", json={"items": [{"response": "y" * i}]}, timeout=30)
            for i in range(1, 7)
        ]
        _wait_until(lambda: "unirl_reward_queue_items 6" in httpx.get(h.url + "/metrics").text)
        scorer.gate.set()
        assert first.result().status_code == 200
        totals = [f.result().json()["results"][0]["total"] for f in rest]
    assert totals == [2.0 * i for i in range(1, 7)]  # each request got its own slice back
    assert scorer.batch_sizes == [1, 6]


def test_queue_full_gets_429_with_retry_after_and_timeout_504():
    scorer = GatedScorer()
    with _serve(scorer, max_batch=1, max_queue_items=1, max_wait_ms=0, request_timeout_s=2) as h:
        with ThreadPoolExecutor(2) as pool:
            blocked = pool.submit(
                httpx.post, h.url + "/v1/score", json={"items": [{"response": "a"}]}, timeout=30
            )
            assert scorer.entered.wait(10)
            queued = pool.submit(
                httpx.post, h.url + "/v1/score", json={"items": [{"response": "b"}]}, timeout=30
            )
            _wait_until(lambda: "unirl_reward_queue_items 1" in httpx.get(h.url + "/metrics").text)
            r = httpx.post(h.url + "/v1/score", json={"items": [{"response": "c"}]})
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
            assert "queue full" in r.json()["detail"]
            assert blocked.result().status_code == 504  # the gate stays shut past request_timeout_s
            assert queued.result().status_code == 504
            scorer.gate.set()
        # the timed-out queued request was dropped, never scored
        _wait_until(lambda: scorer.scored == 1)


def test_auth_required_when_token_set():
    with _serve(LengthScorer(), token=TOKEN) as h:
        body = {"items": [{"response": "x"}]}
        assert httpx.get(h.url + "/health").status_code == 200  # probes stay open
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + TOKEN}):
            r = httpx.post(h.url + "/v1/score", json=body, headers=headers)
            assert r.status_code == 401
            assert TOKEN not in r.text and "wrong" not in r.text
        r = httpx.post(h.url + "/v1/score", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        with RewardClient(h.url, token=TOKEN) as c:
            assert c.score([ScoreItem(response="abcd")])[0].total == 8.0
        with RewardClient(h.url, token="nope") as c, pytest.raises(RewardClientError, match="401"):
            c.version()


def test_token_guards_every_path_but_the_probes():
    with _serve(LengthScorer(), token=TOKEN) as h:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for path in ("/health", "/ready"):
            assert httpx.get(h.url + path).status_code == 200
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect", "/metrics", "/v1/version"):
            r = httpx.get(h.url + path)
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", path
            assert r.json() == {"detail": "missing or invalid bearer token"}
            assert httpx.get(h.url + path, headers=auth).status_code == 200, path
        # default deny: an unknown path does not tell a caller without the token that it is unknown
        assert httpx.get(h.url + "/nope").status_code == 401
        assert httpx.get(h.url + "/nope", headers=auth).status_code == 404


def test_token_is_checked_before_the_body_is_read():
    with _serve(LengthScorer(), token=TOKEN, max_request_bytes=4096) as h:
        url, json_type = h.url + "/v1/score", {"content-type": "application/json"}
        assert httpx.post(url, content=b"{not json", headers=json_type).status_code == 401
        assert httpx.post(url, content=b"x" * 5000, headers=json_type).status_code == 401  # not 413


def test_auth_off_on_loopback_by_default(server):
    h, _ = server
    assert httpx.get(h.url + "/v1/version").status_code == 200


def test_not_ready_while_scorers_load():
    release = threading.Event()

    def slow_build():
        if not release.wait(30):
            raise RuntimeError("test never released the scorers")
        return [WeightedScorer("length", 1.0, LengthScorer())]

    with serve_in_thread(create_app(slow_build), wait_ready=False) as h:
        assert httpx.get(h.url + "/health").status_code == 200
        assert httpx.get(h.url + "/ready").json() == {"status": "not_ready"}
        r = httpx.post(h.url + "/v1/score", json={"items": [{"response": "x"}]})
        assert r.status_code == 503 and r.headers["Retry-After"] == "1" and "loading" in r.json()["detail"]
        release.set()
        _wait_until(lambda: httpx.get(h.url + "/ready").status_code == 200)
        assert httpx.post(h.url + "/v1/score", json={"items": [{"response": "x"}]}).status_code == 200


def test_failed_load_is_reported():
    def broken():
        raise OSError("weights not found at /nowhere")

    with pytest.raises(RuntimeError, match="weights not found"):
        serve_in_thread(create_app(broken))


def test_a_server_without_scorers_does_not_get_ready():
    # the published schema requires the inputs of at least one scorer (server/schema.py)
    with pytest.raises(RuntimeError, match="no scorers"):
        serve_in_thread(create_app(lambda: []))


def test_cli_refuses_public_bind_without_token(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("scorers:\n  - scorer: {kind: exact_match}\n")
    monkeypatch.delenv("UNIRL_REWARD_TOKEN", raising=False)
    assert cli_main(["serve", "--config", str(cfg), "--host", "0.0.0.0"]) == 2
    assert "bearer token is required" in capsys.readouterr().err


def test_client_retries_until_server_frees_up():
    scorer = GatedScorer()
    with _serve(scorer, max_batch=1, max_queue_items=1, max_wait_ms=0) as h, ThreadPoolExecutor(3) as pool:
        blocked = pool.submit(
            httpx.post, h.url + "/v1/score", json={"items": [{"response": "a"}]}, timeout=30
        )
        assert scorer.entered.wait(10)
        queued = pool.submit(httpx.post, h.url + "/v1/score", json={"items": [{"response": "b"}]}, timeout=30)
        _wait_until(lambda: "unirl_reward_queue_items 1" in httpx.get(h.url + "/metrics").text)
        retry = RetryPolicy(max_attempts=50, backoff_s=0.05, max_backoff_s=0.2)
        with RewardClient(h.url, retry=retry) as c:
            got = pool.submit(c.score, [ScoreItem(response="abc")])
            _wait_until(
                lambda: "unirl_reward_rejected_queue_full_total 0" not in httpx.get(h.url + "/metrics").text
            )
            scorer.gate.set()
            assert got.result(timeout=30)[0].total == 6.0
        assert blocked.result().status_code == queued.result().status_code == 200


def test_openapi_spec_committed_and_in_sync():
    spec = json.dumps(openapi_spec(), indent=2, sort_keys=True) + "\n"
    assert OPENAPI.exists(), (
        "run: python -m unirl.reward.cli openapi --output packages/unirl-reward/openapi.json"
    )
    assert OPENAPI.read_text() == spec, (
        "openapi.json is stale; regenerate: python -m unirl.reward.cli openapi --output packages/unirl-reward/openapi.json"
    )


def _wait_until(cond, timeout_s: float = 10.0) -> None:
    """Poll a condition (bounded); the server exposes the state through /metrics."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)
