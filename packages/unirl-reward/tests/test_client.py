"""Client retry policy and idempotency: transport-level fakes for exact sequences, real server for async."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from reward_test_helpers import LengthScorer

from unirl.reward.client import AsyncRewardClient, RetryPolicy, RewardClient, RewardClientError
from unirl.reward.combine import WeightedScorer
from unirl.reward.protocol import ScoreItem
from unirl.reward.server.app import create_app
from unirl.reward.server.runner import serve_in_thread
from unirl.reward.service import RewardService

FAST = RetryPolicy(max_attempts=4, backoff_s=0.001, max_backoff_s=0.01)
OK = {"request_id": "x", "results": [{"total": 1.0, "components": {}}], "identity": "i"}


def _scripted(replies):
    """A transport answering each call with the next reply (a status, a dict, or an exception)."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content) if request.content else None)
        reply = replies[len(seen) - 1]
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, tuple):
            return httpx.Response(reply[0], json={"detail": "busy"}, headers=reply[1])
        if isinstance(reply, int):
            return httpx.Response(reply, json={"detail": f"status {reply}"})
        return httpx.Response(200, json=reply)

    return httpx.MockTransport(handler), seen


def test_retries_keep_one_request_id():
    transport, seen = _scripted([httpx.ConnectError("refused"), 503, (429, {"Retry-After": "0"}), OK])
    with RewardClient("http://reward", transport=transport, retry=FAST) as c:
        assert c.score([ScoreItem(response="a")])[0].total == 1.0
    ids = {s["request_id"] for s in seen}
    assert len(seen) == 4 and len(ids) == 1  # the same idempotency key on every attempt


def test_4xx_is_not_retried_and_carries_the_message():
    transport, seen = _scripted([422, OK])
    with (
        RewardClient("http://reward", transport=transport, retry=FAST) as c,
        pytest.raises(RewardClientError) as e,
    ):
        c.score([ScoreItem(response="a")])
    assert e.value.status == 422 and "status 422" in str(e.value) and len(seen) == 1


def test_gives_up_after_max_attempts():
    transport, seen = _scripted([500] * 4)
    with (
        RewardClient("http://reward", transport=transport, retry=FAST) as c,
        pytest.raises(RewardClientError, match="unavailable after 4 attempts"),
    ):
        c.score([ScoreItem(response="a")])
    assert len(seen) == 4


def test_retry_after_is_honoured_and_capped():
    p = RetryPolicy(backoff_s=0.1, max_backoff_s=2.0)
    assert p.delay(0, "1.5") == 1.5
    assert p.delay(0, "100") == 2.0
    assert 0.05 <= p.delay(0, None) <= 0.1  # backoff * 2**0 * U(0.5, 1)
    assert 0.2 <= p.delay(2, "garbage") <= 0.4


def test_connection_refused_is_a_clear_error():
    with (
        RewardClient("http://127.0.0.1:9", retry=FAST) as c,  # port 9 (discard): nothing listens
        pytest.raises(RewardClientError, match="unavailable after 4 attempts: ConnectError"),
    ):
        c.score([ScoreItem(response="a")])


def test_async_client_and_remote_service_against_real_server():
    scorer = LengthScorer()
    app = create_app(lambda: [WeightedScorer("length", 1.0, scorer)])
    with serve_in_thread(app) as h:

        async def go():
            async with AsyncRewardClient(h.url) as c:
                batches = await asyncio.gather(*(c.score([ScoreItem(response="x" * i)]) for i in range(5)))
                return [b[0].total for b in batches], (await c.version()).identity

        totals, ident = asyncio.run(go())
        assert totals == [0.0, 1.0, 2.0, 3.0, 4.0]
        with RewardService.remote(h.url) as svc:
            assert svc.identity() == ident
            assert [r.total for r in svc.score([ScoreItem(response="abc")])] == [3.0]
            assert svc.score([]) == []
