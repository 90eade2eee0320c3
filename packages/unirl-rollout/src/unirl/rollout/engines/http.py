"""The HTTP client every dedicated engine (SGLang, vLLM-Omni) talks through.

Bounded waits everywhere: each request has a connect and a read timeout, retries are limited to
idempotent requests and to connection errors / 502, 503, 504, and ``wait_healthy`` polls under
a deadline. A failure raises :class:`EngineHTTPError` naming the engine URL, the route, the HTTP
status and the server's message; a reply that is not the JSON the route promises raises
:class:`EngineProtocolError` naming the route and what was missing. Requests that move weights
are never retried: a half-applied update must surface, not be replayed.

httpx is imported lazily so ``import unirl.rollout.engines`` works without it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import httpx

__all__ = [
    "EngineHTTPClient",
    "EngineHTTPError",
    "EngineProtocolError",
    "EngineRetry",
    "HTTPEngineConfig",
    "require",
]

RETRY_STATUS = frozenset({502, 503, 504})


class EngineHTTPError(RuntimeError):
    """The engine could not be reached, timed out, or answered an error status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class EngineProtocolError(ValueError):
    """The engine answered, but not in the documented wire format (malformed JSON, missing fields)."""


@dataclass(frozen=True)
class EngineRetry:
    """Attempts for idempotent requests; delay_k = min(max_backoff_s, backoff_s * 2**k) * U(0.5, 1)."""

    max_attempts: int = 3
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def delay(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:
        raise ImportError(
            "dedicated rollout engines talk HTTP through httpx: pip install 'unirl-rollout[engines]'"
        ) from None
    return httpx


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    if isinstance(body, dict):
        for key in ("detail", "error", "message"):
            if key in body:
                return str(body[key])[:500]
    return str(body)[:500]


def require(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]`` checked to be a ``kind``; EngineProtocolError naming ``where`` otherwise."""
    if not isinstance(obj, dict):
        raise EngineProtocolError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise EngineProtocolError(f"{where}: field {key!r} is missing; present: {sorted(obj)}")
    value = obj[key]
    if not isinstance(value, kind):
        raise EngineProtocolError(f"{where}: field {key!r} is {type(value).__name__}, expected {kind}")
    return value


class EngineHTTPClient:
    """A synchronous JSON/bytes client of one engine server.

    Args:
        url: the server's base URL, e.g. ``http://10.0.0.5:30000``.
        api_key: sent as ``Authorization: Bearer <api_key>`` when given (SGLang ``--api-key``,
            vLLM ``--api-key``).
        connect_timeout_s: seconds to establish a connection.
        timeout_s: seconds to wait for a reply (per request; sampling a large batch takes long).
        retry: attempts for idempotent requests.
        transport: an httpx transport (tests).
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        connect_timeout_s: float = 10.0,
        timeout_s: float = 600.0,
        retry: EngineRetry | None = None,
        transport: Any = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"engine url={url!r} must start with http:// or https://")
        httpx = _httpx()
        self.url = url.rstrip("/")
        self.retry = retry or EngineRetry()
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            headers=headers,
            transport=transport,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        idempotent: bool = True,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        """Send one request; retried (idempotent only) on connection errors and 502/503/504."""
        httpx = _httpx()
        attempts = self.retry.max_attempts if idempotent else 1
        kw: dict[str, Any] = {"json": json}
        if timeout_s is not None:
            kw["timeout"] = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        last = ""
        for attempt in range(attempts):
            try:
                resp = self._http.request(method, self.url + path, **kw)
            except httpx.TimeoutException as e:
                last = f"timed out ({type(e).__name__}) after {timeout_s or self.timeout_s:g} s"
            except httpx.TransportError as e:
                last = f"unreachable ({type(e).__name__}: {e})"
            else:
                if resp.status_code < 400:
                    return resp
                last = f"HTTP {resp.status_code}: {_detail(resp)}"
                if resp.status_code not in RETRY_STATUS:
                    raise EngineHTTPError(f"engine {self.url} {method} {path}: {last}", resp.status_code)
            if attempt + 1 < attempts:
                time.sleep(self.retry.delay(attempt))
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        raise EngineHTTPError(f"engine {self.url} {method} {path} failed{tries}: {last}")

    def post_json(
        self, path: str, body: Any, *, idempotent: bool = True, timeout_s: float | None = None
    ) -> Any:
        """POST ``body`` as JSON and parse a JSON reply."""
        return self.json_of(
            self.request("POST", path, json=body, idempotent=idempotent, timeout_s=timeout_s), path
        )

    def get_json(self, path: str, *, timeout_s: float | None = None) -> Any:
        return self.json_of(self.request("GET", path, timeout_s=timeout_s), path)

    def json_of(self, resp: httpx.Response, path: str) -> Any:
        try:
            return resp.json()
        except ValueError:
            raise EngineProtocolError(
                f"engine {self.url} {path}: reply is not JSON (content-type "
                f"{resp.headers.get('content-type')!r}): {resp.text[:200]!r}"
            ) from None

    def healthy(self, path: str = "/health", timeout_s: float = 5.0) -> bool:
        """True when ``path`` answers 2xx within ``timeout_s``."""
        httpx = _httpx()
        try:
            return self._http.get(self.url + path, timeout=timeout_s).status_code < 300
        except httpx.HTTPError:
            return False

    def wait_healthy(self, path: str = "/health", timeout_s: float = 300.0, poll_s: float = 1.0) -> None:
        """Poll ``path`` until it answers 2xx; EngineHTTPError after ``timeout_s`` (a server loading weights)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.healthy(path, timeout_s=min(5.0, timeout_s)):
                return
            if time.monotonic() >= deadline:
                raise EngineHTTPError(
                    f"engine {self.url}{path} did not become healthy within {timeout_s:g} s; is the "
                    "server running and the URL right?"
                )
            time.sleep(poll_s)

    def close(self) -> None:
        self._http.close()


class HTTPEngineConfig(BaseModel):
    """Fields and client construction shared by every engine reached over HTTP."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="server base URL, e.g. http://10.0.0.5:30000")
    api_key: str | None = Field(default=None, description="the server's --api-key (sent as a bearer token)")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    timeout_s: float = Field(default=600.0, gt=0, description="per-request reply bound")

    def client(self, transport: Any = None) -> EngineHTTPClient:
        """A client of ``url`` with these timeouts and the default retry policy."""
        return EngineHTTPClient(
            self.url,
            api_key=self.api_key,
            connect_timeout_s=self.connect_timeout_s,
            timeout_s=self.timeout_s,
            retry=EngineRetry(),
            transport=transport,
        )
