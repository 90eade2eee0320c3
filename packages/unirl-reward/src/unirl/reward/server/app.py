"""The FastAPI app: POST /v1/score, GET /health, /ready, /v1/version, /metrics.

Request path: auth (401, before any body is read) -> size limit (413) -> JSON parse (422; NaN
and infinities are refused anywhere) -> schema validation (422) -> idempotency cache (a
retried id is answered from cache, 409 if its body differs) -> media decode (422) -> input
check against each scorer's modality (422) -> dynamic batcher (429 + Retry-After when full)
-> per-request timeout (504). Error bodies, on every path, are JSON `{"detail": str}` (a
Prometheus scraper ignores the body of a failed scrape) and never echo a token.

With a token, every path needs it but the probes /health and /ready: the API, /metrics, and
the schema and its viewers (/openapi.json, /docs, /redoc); see `auth.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from unirl.reward import __version__
from unirl.reward.combine import WeightedScorer, combine, identity
from unirl.reward.convert import MediaError, result_to_wire, wire_to_item
from unirl.reward.protocol import ScoreItem, ScoreResult, check_inputs
from unirl.reward.server.auth import BearerTokenMiddleware
from unirl.reward.server.batcher import BatchStats, DynamicBatcher, QueueFull
from unirl.reward.server.dedup import IdConflict, IdempotencyCache
from unirl.reward.server.finite_json import FiniteJSONRoute
from unirl.reward.server.limits import BodyLimitMiddleware
from unirl.reward.server.metrics import Metrics
from unirl.reward.server.schema import published_spec
from unirl.reward.server.settings import ServerSettings
from unirl.types.wire import (
    WIRE_SCHEMA_VERSION,
    ErrorResponse,
    HealthResponse,
    ScoreRequest,
    ScoreResponse,
    ScorerInfo,
    VersionResponse,
)

log = logging.getLogger("unirl.reward.server")


class HTTPError(Exception):
    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers


def _torch_threads_initializer(n: int | None) -> Callable[[], None] | None:
    """Set torch's intra-op threads inside the scorer thread (OpenMP settings are per thread)."""
    if n is None:
        return None

    def init() -> None:
        import torch

        torch.set_num_threads(n)

    return init


def _finite_or_none(r: tuple[float, float]) -> tuple[float | None, float | None]:
    """JSON has no infinity: an unbounded end of an output range travels as null."""
    lo, hi = r
    return (lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None)


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": ErrorResponse} for c in codes}


def _spec_for(app: FastAPI, state: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """`app.openapi`: the spec of any deployment until the scorers load, then this one's.

    FastAPI's own spec stays at `app.state.fastapi_openapi` (see `openapi.openapi_spec`).
    """
    app.state.fastapi_openapi = app.openapi
    cache: dict[bool, dict[str, Any]] = {}

    def openapi() -> dict[str, Any]:
        scorers = state["scorers"]
        loaded = scorers is not None
        if loaded not in cache:
            modalities = [ws.scorer.modality for ws in scorers] if loaded else None
            cache[loaded] = published_spec(app.state.fastapi_openapi(), modalities)
        return cache[loaded]

    return openapi


def create_app(
    build_scorers: Callable[[], Sequence[WeightedScorer]],
    settings: ServerSettings | None = None,
    token: str | None = None,
) -> FastAPI:
    """The app; `build_scorers` runs at startup (in a thread) and /ready answers 200 once it returns."""
    settings = settings or ServerSettings()
    if token is not None and not token.strip():
        # an empty token would let in every request that sends `Authorization: Bearer`
        raise ValueError("token is empty; pass a non-empty secret, or None for no auth (loopback only)")
    state: dict[str, Any] = {"scorers": None, "batcher": None, "load_error": None}
    metrics = Metrics()
    cache = IdempotencyCache(ttl_s=settings.idempotency_ttl_s)

    def score_fn(items: Sequence[ScoreItem]) -> list[ScoreResult]:
        return combine(state["scorers"], items)

    loaded = threading.Event()  # set once loading ends, ready or not (serve_in_thread waits on it)

    async def load() -> None:
        try:
            scorers = await run_in_threadpool(lambda: list(build_scorers()))
            if not scorers:  # the published schema relies on at least one scorer (see schema.py)
                raise ValueError("build_scorers returned no scorers; configure at least one")
        except Exception as e:
            log.exception("loading the scorers failed; the server stays not ready")
            state["load_error"] = f"{type(e).__name__}: {e}"
            loaded.set()
            return
        state["scorers"], state["identity"] = scorers, identity(scorers)
        batcher = DynamicBatcher(
            score_fn,
            settings.max_batch,
            settings.max_wait_ms / 1000,
            settings.max_queue_items,
            thread_initializer=_torch_threads_initializer(settings.torch_threads),
        )
        batcher.start()
        state["batcher"] = batcher
        loaded.set()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Scorers (model weights) load in the background: /health answers at once, /ready once loaded.
        task = asyncio.get_running_loop().create_task(load())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if state["batcher"] is not None:
            await state["batcher"].stop()
        for ws in state["scorers"] or []:
            close = getattr(ws.scorer, "close", None)
            if callable(close):
                close()

    app = FastAPI(title="unirl-reward", version=__version__, lifespan=lifespan)
    app.router.route_class = FiniteJSONRoute
    app.state.loaded = loaded
    app.state.has_token = token is not None  # serve_in_thread refuses a public bind without one
    app.state.load_state = state
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    if token is not None:  # added last, so outermost: runs before the body limit reads anything
        app.add_middleware(BearerTokenMiddleware, token=token)
    app.openapi = _spec_for(app, state)  # type: ignore[method-assign]
    # Documents the scheme per operation in the spec; BearerTokenMiddleware does the check.
    bearer = HTTPBearer(
        auto_error=False,
        description="Required, when the server has a token (always when it is not bound to "
        "loopback), on every path but /health and /ready.",
    )

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail
        if exc.status_code == 400 and "parsing the body" in str(detail):
            detail = "cannot parse the request body: send UTF-8 JSON matching ScoreRequest"
        return JSONResponse({"detail": str(detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors()[:10]:  # loc + msg only: never echo the (possibly huge) input
            if e.get("type") == "json_invalid":  # loc is ("body", char offset)
                where, why = e.get("loc", ("body", "?"))[-1], (e.get("ctx") or {}).get("error", "")
                parts.append(f"body: not valid JSON at char {where}: {why}; send JSON matching ScoreRequest")
                continue
            loc = ".".join(str(x) for x in e.get("loc", ()))
            parts.append(f"{loc}: {e.get('msg', 'invalid')}")
        return JSONResponse({"detail": "invalid request: " + "; ".join(parts)}, status_code=422)

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

    def _ready_batcher() -> DynamicBatcher:
        if state["load_error"] is not None:
            raise HTTPError(503, "scorers failed to load; see the server log")
        if state["batcher"] is None:
            raise HTTPError(503, "scorers are still loading; poll GET /ready", {"Retry-After": "1"})
        batcher: DynamicBatcher = state["batcher"]
        return batcher

    @app.get(
        "/v1/version",
        response_model=VersionResponse,
        responses=_errors(401, 503),
        dependencies=[Depends(bearer)],
    )
    async def version() -> VersionResponse:
        """Scorer names, versions and weights, and their identity hash."""
        _ready_batcher()
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
        "/metrics", response_class=PlainTextResponse, responses=_errors(401), dependencies=[Depends(bearer)]
    )
    async def metrics_endpoint() -> str:
        """Prometheus text format."""
        batcher = state["batcher"]
        stats = batcher.stats if batcher else BatchStats()
        return metrics.render(stats, batcher.queued_items if batcher else 0, cache.hits)

    @app.post(
        "/v1/score",
        response_model=ScoreResponse,
        responses=_errors(400, 401, 409, 413, 422, 429, 500, 503, 504),
        dependencies=[Depends(bearer)],
    )
    async def score(req: ScoreRequest) -> ScoreResponse:
        """Score a batch of items with every configured scorer; one result per item, in order."""
        t0 = time.monotonic()
        batcher = _ready_batcher()
        status = 200
        try:
            return await _score(req, batcher)
        except HTTPError as e:
            status = e.status
            raise
        finally:
            metrics.observe(status, time.monotonic() - t0)

    async def _score(req: ScoreRequest, batcher: DynamicBatcher) -> ScoreResponse:
        if req.request_id is None:
            return await _compute(req, batcher, f"anon-{uuid.uuid4().hex}")
        body_hash = hashlib.sha256(req.model_dump_json(exclude={"request_id"}).encode()).hexdigest()
        try:
            fut, new = cache.claim(req.request_id, body_hash)
        except IdConflict as e:
            raise HTTPError(409, str(e)) from None
        if not new:
            resp: ScoreResponse = await asyncio.shield(fut)
            return resp.model_copy(update={"cached": True})
        try:
            resp = await _compute(req, batcher, req.request_id)
        except BaseException as e:
            cache.forget(req.request_id, e)
            raise
        cache.resolve(req.request_id, resp)
        return resp

    async def _compute(req: ScoreRequest, batcher: DynamicBatcher, request_id: str) -> ScoreResponse:
        items = await run_in_threadpool(_decode_and_check, req)
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
            request_id=request_id, results=[result_to_wire(r) for r in results], identity=state["identity"]
        )

    def _decode_and_check(req: ScoreRequest) -> list[ScoreItem]:
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
        for ws in state["scorers"]:
            try:
                check_inputs(ws.name, ws.scorer.modality, items)
            except ValueError as e:
                raise HTTPError(422, str(e)) from None
        return items

    return app
