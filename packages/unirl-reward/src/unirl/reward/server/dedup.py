"""Idempotency cache: a retried `request_id` within `ttl_s` gets the first answer, not a rescore.

An entry holds the request's body hash and a future of its response. A repeat with the same
body waits on (or reads) that future; a repeat with a different body is a client bug (409).
A request that failed (4xx/5xx) is forgotten so its retry is scored afresh.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


class IdConflict(Exception):
    """The request id was already used with a different body."""


@dataclass
class _Entry:
    body_hash: str
    future: asyncio.Future[Any]
    expires: float


class IdempotencyCache:
    """`claim(id, hash)` -> (future, is_new). The owner of a new claim must `resolve` or `forget` it."""

    def __init__(self, ttl_s: float = 300.0, max_entries: int = 100_000) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.hits = 0

    def _prune(self, now: float) -> None:
        """Drop expired (oldest first) and over-capacity entries; never an in-flight one."""
        for key in list(self._entries):
            entry = self._entries[key]
            if entry.expires > now and len(self._entries) <= self.max_entries:
                break
            if entry.future.done():
                del self._entries[key]

    def claim(self, request_id: str, body_hash: str) -> tuple[asyncio.Future[Any], bool]:
        now = time.monotonic()
        self._prune(now)
        entry = self._entries.get(request_id)
        if entry is not None and entry.expires > now:
            if entry.body_hash != body_hash:
                raise IdConflict(
                    f"request_id {request_id!r} was already used with a different body; use a fresh id per request"
                )
            self.hits += 1
            return entry.future, False
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._entries[request_id] = _Entry(body_hash, fut, now + self.ttl_s)
        return fut, True

    def resolve(self, request_id: str, value: Any) -> None:
        entry = self._entries.get(request_id)
        if entry is not None and not entry.future.done():
            entry.future.set_result(value)

    def forget(self, request_id: str, error: BaseException) -> None:
        entry = self._entries.pop(request_id, None)
        if entry is not None and not entry.future.done():
            entry.future.set_exception(error)
            entry.future.exception()  # mark retrieved: waiters re-raise it, nobody logs it as lost
