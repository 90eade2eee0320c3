"""Error replies of the app: every failure answers JSON `{"detail": str}`, never echoing input."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from unirl.types.wire import ErrorResponse


class HTTPError(Exception):
    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route that may fail with `codes`, each with an ErrorResponse body."""
    return {c: {"model": ErrorResponse} for c in codes}


def add_error_handlers(app: FastAPI) -> None:
    """Answer HTTPError, Starlette's HTTP errors and request validation errors as `{"detail"}`."""

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
