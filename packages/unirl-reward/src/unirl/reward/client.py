"""HTTP client of the reward server (httpx), sync and async, with retries and idempotent ids.

Each `score` call picks one `request_id` and reuses it on every retry, so a request the server
already scored (the reply was lost) is answered from the server's idempotency cache instead of
being scored and counted twice. Retried: 429 (honouring Retry-After), 500/502/503/504, and
connection/timeout errors, with exponential backoff and jitter. Any other 4xx raises
`RewardClientError` carrying the server's message at once.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from unirl.reward.convert import MediaEncoding, item_to_wire, wire_to_result
from unirl.reward.protocol import ScoreItem, ScoreResult
from unirl.types.wire import ScoreRequest, ScoreResponse, VersionResponse

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class RewardClientError(RuntimeError):
    """The server rejected the request (4xx) or stayed unavailable through every retry."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts and backoff: delay_k = min(max_backoff_s, backoff_s * 2**k) * U(0.5, 1)."""

    max_attempts: int = 6
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0

    def delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after is not None:
            try:
                return min(self.max_backoff_s, max(0.0, float(retry_after)))
            except ValueError:
                pass
        return min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        return str(body.get("detail", body)) if isinstance(body, dict) else str(body)
    except ValueError:
        return resp.text[:500]


def _check(resp: httpx.Response) -> None:
    if resp.status_code >= 400:
        raise RewardClientError(
            f"reward server answered {resp.status_code}: {_detail(resp)}", resp.status_code
        )


def _build_request(items: Sequence[ScoreItem], request_id: str | None, media: MediaEncoding) -> bytes:
    req = ScoreRequest(
        request_id=request_id or uuid.uuid4().hex, items=[item_to_wire(i, media) for i in items]
    )
    return req.model_dump_json(exclude_defaults=False).encode()


class _Base:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        media: MediaEncoding = "png",
    ) -> None:
        self.url = url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.media = media
        self.timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def _give_up(self, last: str) -> RewardClientError:
        return RewardClientError(
            f"reward server at {self.url} unavailable after {self.retry.max_attempts} attempts: {last}"
        )


class RewardClient(_Base):
    """Synchronous client. `score(items)` -> one ScoreResult per item (weighted total + components)."""

    def __init__(self, url: str, *, transport: httpx.BaseTransport | None = None, **kw: object) -> None:
        super().__init__(url, **kw)  # type: ignore[arg-type]
        self._http = httpx.Client(timeout=self.timeout_s, headers=self._headers, transport=transport)

    def _send(self, method: str, path: str, body: bytes | None = None) -> httpx.Response:
        last = ""
        for attempt in range(self.retry.max_attempts):
            try:
                resp = self._http.request(method, self.url + path, content=body)
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
                time.sleep(self.retry.delay(attempt, None))
                continue
            if resp.status_code not in RETRY_STATUS:
                _check(resp)
                return resp
            last = f"HTTP {resp.status_code}: {_detail(resp)}"
            time.sleep(self.retry.delay(attempt, resp.headers.get("Retry-After")))
        raise self._give_up(last)

    def score_response(self, items: Sequence[ScoreItem], request_id: str | None = None) -> ScoreResponse:
        """The full wire response (results, scorer identity, whether it came from the cache)."""
        resp = self._send("POST", "/v1/score", _build_request(items, request_id, self.media))
        return ScoreResponse.model_validate_json(resp.content)

    def score(self, items: Sequence[ScoreItem], request_id: str | None = None) -> list[ScoreResult]:
        return [wire_to_result(r) for r in self.score_response(items, request_id).results]

    def version(self) -> VersionResponse:
        return VersionResponse.model_validate_json(self._send("GET", "/v1/version").content)

    def ready(self) -> bool:
        try:
            return self._http.get(self.url + "/ready").status_code == 200
        except httpx.TransportError:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRewardClient(_Base):
    """asyncio twin of `RewardClient` (same retries and idempotency)."""

    def __init__(self, url: str, *, transport: httpx.AsyncBaseTransport | None = None, **kw: object) -> None:
        super().__init__(url, **kw)  # type: ignore[arg-type]
        self._http = httpx.AsyncClient(timeout=self.timeout_s, headers=self._headers, transport=transport)

    async def _send(self, method: str, path: str, body: bytes | None = None) -> httpx.Response:
        last = ""
        for attempt in range(self.retry.max_attempts):
            try:
                resp = await self._http.request(method, self.url + path, content=body)
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
                await asyncio.sleep(self.retry.delay(attempt, None))
                continue
            if resp.status_code not in RETRY_STATUS:
                _check(resp)
                return resp
            last = f"HTTP {resp.status_code}: {_detail(resp)}"
            await asyncio.sleep(self.retry.delay(attempt, resp.headers.get("Retry-After")))
        raise self._give_up(last)

    async def score_response(
        self, items: Sequence[ScoreItem], request_id: str | None = None
    ) -> ScoreResponse:
        resp = await self._send("POST", "/v1/score", _build_request(items, request_id, self.media))
        return ScoreResponse.model_validate_json(resp.content)

    async def score(self, items: Sequence[ScoreItem], request_id: str | None = None) -> list[ScoreResult]:
        return [wire_to_result(r) for r in (await self.score_response(items, request_id)).results]

    async def version(self) -> VersionResponse:
        return VersionResponse.model_validate_json((await self._send("GET", "/v1/version")).content)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
