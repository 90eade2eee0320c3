"""Bearer-token check as a pure ASGI middleware, outermost: no body is read before it passes.

Default deny: with a token set, every path needs it (the API, /metrics, /openapi.json, /docs,
/redoc and paths that do not exist) except the probes in `open_paths`, which say only
"ok" / "not_ready". An orchestrator can probe without the secret; nothing about the scorers,
the schema or the load leaks to a caller without it.
"""

from __future__ import annotations

import hmac
from typing import Any

from unirl.reward.server.limits import reply_error

PROBES = frozenset({"/health", "/ready"})
UNAUTHORIZED = "missing or invalid bearer token"


class BearerTokenMiddleware:
    """Answer 401 (`WWW-Authenticate: Bearer`) unless `Authorization: Bearer <token>` matches."""

    def __init__(self, app: Any, token: str, open_paths: frozenset[str] = PROBES) -> None:
        self.app, self.token, self.open_paths = app, token.encode(), open_paths

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths and not self._authorized(scope):
            await reply_error(send, 401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: dict[str, Any]) -> bool:
        header = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, credentials = header.partition(b" ")
        # compare_digest runs in time independent of where the strings differ
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.token)
