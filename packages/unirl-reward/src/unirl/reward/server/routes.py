"""The app's routes: the probes and read-only endpoints, and POST /v1/score.

Each reads the load state that `app.create_app` shares with its loader: a dict with the
keys `scorers`, `identity`, `batcher` and `load_error` (None until set).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
import uuid
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPBearer
from starlette.concurrency import run_in_threadpool

from unirl.reward import __version__
from unirl.reward.convert import MediaError, result_to_wire, wire_to_item
from unirl.reward.protocol import ScoreItem, check_inputs
from unirl.reward.server.batcher import BatchStats, DynamicBatcher, QueueFull
from unirl.reward.server.dedup import IdConflict, IdempotencyCache
from unirl.reward.server.errors import HTTPError, error_responses
from unirl.reward.server.metrics import Metrics
from unirl.reward.server.settings import ServerSettings
from unirl.types.wire import (
    WIRE_SCHEMA_VERSION,
    HealthResponse,
    ScoreRequest,
    ScoreResponse,
    ScorerInfo,
    VersionResponse,
)

log = logging.getLogger("unirl.reward.server")


def _finite_or_none(r: tuple[float, float]) -> tuple[float | None, float | None]:
    """JSON has no infinity: an unbounded end of an output range travels as null."""
    lo, hi = r
    return (lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None)


def ready_batcher(state: dict[str, Any]) -> DynamicBatcher:
    """The running batcher, or a 503 saying whether the scorers failed or are still loading."""
    if state["load_error"] is not None:
        raise HTTPError(503, "scorers failed to load; see the server log")
    if state["batcher"] is None:
        raise HTTPError(503, "scorers are still loading; poll GET /ready", {"Retry-After": "1"})
    batcher: DynamicBatcher = state["batcher"]
    return batcher


def add_info_routes(
    app: FastAPI, state: dict[str, Any], metrics: Metrics, cache: IdempotencyCache, bearer: HTTPBearer
) -> None:
    """GET /health, /ready, /v1/version and /metrics."""

    @app.get("/health", response_model=HealthResponse)
    async def health() -> HealthResponse:
        """Liveness: the process answers."""
        return HealthResponse(status="ok")

    @app.get("/ready", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def ready() -> Any:
        """Readiness: scorers are loaded and the batcher runs."""
        if state["batcher"] is None:
            return JSONResponse({"status": "not_ready"}, status_code=503)
        return HealthResponse(status="ok")

    @app.get(
        "/v1/version",
        response_model=VersionResponse,
        responses=error_responses(401, 503),
        dependencies=[Depends(bearer)],
    )
    async def version() -> VersionResponse:
        """Scorer names, versions and weights, and their identity hash."""
        ready_batcher(state)
        infos = [
            ScorerInfo(
                name=ws.name,
                kind=type(ws.scorer).__name__,
                version=str(ws.scorer.version),
                weight=ws.weight,
                modality=ws.scorer.modality,
                output_range=_finite_or_none(ws.scorer.output_range),
            )
            for ws in state["scorers"]
        ]
        return VersionResponse(
            server_version=__version__,
            wire_schema_version=WIRE_SCHEMA_VERSION,
            identity=state["identity"],
            scorers=infos,
        )

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses=error_responses(401),
        dependencies=[Depends(bearer)],
    )
    async def metrics_endpoint() -> str:
        """Prometheus text format."""
        batcher = state["batcher"]
        stats = batcher.stats if batcher else BatchStats()
        return metrics.render(stats, batcher.queued_items if batcher else 0, cache.hits)


def add_score_route(
    app: FastAPI,
    state: dict[str, Any],
    settings: ServerSettings,
    metrics: Metrics,
    cache: IdempotencyCache,
    bearer: HTTPBearer,
) -> None:
    """POST /v1/score: idempotency cache -> decode and check -> batcher -> timeout."""
    path = _ScorePath(state, settings, metrics, cache)

    @app.post(
        "/v1/score",
        response_model=ScoreResponse,
        responses=error_responses(400, 401, 409, 413, 422, 429, 500, 503, 504),
        dependencies=[Depends(bearer)],
    )
    async def score(req: ScoreRequest) -> ScoreResponse:
        """Score a batch of items with every configured scorer; one result per item, in order."""
        t0 = time.monotonic()
        batcher = ready_batcher(state)
        status = 200
        try:
            return await path.score(req, batcher)
        except HTTPError as e:
            status = e.status
            raise
        finally:
            metrics.observe(status, time.monotonic() - t0)


class _ScorePath:
    """The steps of one validated ScoreRequest, each failure an HTTPError."""

    def __init__(
        self, state: dict[str, Any], settings: ServerSettings, metrics: Metrics, cache: IdempotencyCache
    ) -> None:
        self.state, self.settings, self.metrics, self.cache = state, settings, metrics, cache

    async def score(self, req: ScoreRequest, batcher: DynamicBatcher) -> ScoreResponse:
        """Answer a retried request id from the cache (409 if its body differs), else compute."""
        cache = self.cache
        if req.request_id is None:
            return await self._compute(req, batcher, f"anon-{uuid.uuid4().hex}")
        body_hash = hashlib.sha256(req.model_dump_json(exclude={"request_id"}).encode()).hexdigest()
        try:
            fut, new = cache.claim(req.request_id, body_hash)
        except IdConflict as e:
            raise HTTPError(409, str(e)) from None
        if not new:
            resp: ScoreResponse = await asyncio.shield(fut)
            return resp.model_copy(update={"cached": True})
        try:
            resp = await self._compute(req, batcher, req.request_id)
        except BaseException as e:
            cache.forget(req.request_id, e)
            raise
        cache.resolve(req.request_id, resp)
        return resp

    async def _compute(self, req: ScoreRequest, batcher: DynamicBatcher, request_id: str) -> ScoreResponse:
        settings, metrics = self.settings, self.metrics
        items = await run_in_threadpool(self._decode_and_check, req)
        try:
            fut = batcher.submit(items)
        except QueueFull as e:
            metrics.rejected_queue_full += 1
            raise HTTPError(429, str(e), {"Retry-After": f"{max(1, round(e.retry_after_s))}"}) from None
        try:
            results = await asyncio.wait_for(fut, settings.request_timeout_s)
        except TimeoutError:
            metrics.timeouts += 1
            raise HTTPError(
                504, f"not scored within request_timeout_s={settings.request_timeout_s}"
            ) from None
        except ValueError as e:
            raise HTTPError(422, f"cannot score this request: {e}") from None
        except Exception:
            log.exception("scorer failed on request %s", request_id)
            raise HTTPError(500, "a scorer failed on this request; see the server log") from None
        return ScoreResponse(
            request_id=request_id,
            results=[result_to_wire(r) for r in results],
            identity=self.state["identity"],
        )

    def _decode_and_check(self, req: ScoreRequest) -> list[ScoreItem]:
        settings = self.settings
        if len(req.items) > settings.max_queue_items:  # would get 429 on every retry, forever
            raise HTTPError(
                413,
                f"items: {len(req.items)} items, more than this server queues at once "
                f"(max_queue_items={settings.max_queue_items}); split the request",
            )
        items = []
        for i, w in enumerate(req.items):
            try:
                items.append(wire_to_item(w, settings.max_pixels))
            except MediaError as e:
                raise HTTPError(422, f"items.{i}.{e.field}: {e.reason}") from None
            except (ValueError, TypeError) as e:
                raise HTTPError(422, f"items.{i}: {e}") from None
        for ws in self.state["scorers"]:
            try:
                check_inputs(ws.name, ws.scorer.modality, items)
            except ValueError as e:
                raise HTTPError(422, str(e)) from None
        return items
