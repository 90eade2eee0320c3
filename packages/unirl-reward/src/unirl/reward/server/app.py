"""The FastAPI app: POST /v1/score, GET /health, /ready, /v1/version, /metrics.

Request path: auth (401, before any body is read) -> size limit (413) -> JSON parse (422; NaN
and infinities are refused anywhere) -> schema validation (422) -> idempotency cache (a
retried id is answered from cache, 409 if its body differs) -> media decode (422) -> input
check against each scorer's modality (422) -> dynamic batcher (429 + Retry-After when full)
-> per-request timeout (504). Error bodies, on every path, are JSON `{"detail": str}` (a
Prometheus scraper ignores the body of a failed scrape) and never echo a token.

With a token, every path needs it but the probes /health and /ready: the API, /metrics, and
the schema and its viewers (/openapi.json, /docs, /redoc); see `auth.py`. The routes are in
`routes.py`, the error replies in `errors.py`; this module composes them and loads the scorers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.security import HTTPBearer
from starlette.concurrency import run_in_threadpool

from unirl.reward import __version__
from unirl.reward.combine import WeightedScorer, combine, identity
from unirl.reward.protocol import ScoreItem, ScoreResult
from unirl.reward.server.auth import BearerTokenMiddleware
from unirl.reward.server.batcher import DynamicBatcher
from unirl.reward.server.dedup import IdempotencyCache
from unirl.reward.server.errors import add_error_handlers
from unirl.reward.server.finite_json import FiniteJSONRoute
from unirl.reward.server.limits import BodyLimitMiddleware
from unirl.reward.server.metrics import Metrics
from unirl.reward.server.routes import add_info_routes, add_score_route
from unirl.reward.server.schema import published_spec
from unirl.reward.server.settings import ServerSettings

log = logging.getLogger("unirl.reward.server")

LifespanFn = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]


def _torch_threads_initializer(n: int | None) -> Callable[[], None] | None:
    """Set torch's intra-op threads inside the scorer thread (OpenMP settings are per thread)."""
    if n is None:
        return None

    def init() -> None:
        import torch

        torch.set_num_threads(n)

    return init


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


def _lifespan(
    build_scorers: Callable[[], Sequence[WeightedScorer]],
    settings: ServerSettings,
    state: dict[str, Any],
    loaded: threading.Event,
) -> LifespanFn:
    """Load the scorers in the background and start the batcher; on shutdown stop and close them.

    `loaded` is set once loading ends, ready or not (serve_in_thread waits on it).
    """

    def score_fn(items: Sequence[ScoreItem]) -> list[ScoreResult]:
        return combine(state["scorers"], items)

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

    return lifespan


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
    loaded = threading.Event()

    lifespan = _lifespan(build_scorers, settings, state, loaded)
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
    add_error_handlers(app)
    add_info_routes(app, state, metrics, cache, bearer)
    add_score_route(app, state, settings, metrics, cache, bearer)
    return app
