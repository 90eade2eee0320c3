"""Request body size limit as a pure ASGI middleware (checked while streaming, not after)."""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException

Scope = dict[str, Any]


class _TooLarge(HTTPException):
    """An HTTPException, so frameworks that wrap body-read errors re-raise it as the 413 it is."""


class BodyLimitMiddleware:
    """Answer 413 when Content-Length, or the bytes actually received, exceed `max_bytes`."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_bytes
            except ValueError:
                await reply_error(send, 400, "Content-Length is not an integer")
                return
            if too_big:
                await reply_error(send, 413, self._msg())
                return
        received = 0
        started = False

        async def limited_receive() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge(413, self._msg())
            return message

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await reply_error(send, 413, self._msg())

    def _msg(self) -> str:
        return f"request body larger than max_request_bytes={self.max_bytes}; send fewer or smaller items"


async def reply_error(
    send: Any, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Send the server's error body, `{"detail": str}` as JSON, from ASGI middleware."""
    body = json.dumps({"detail": detail}).encode()
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": start + (headers or [])})
    await send({"type": "http.response.body", "body": body})
