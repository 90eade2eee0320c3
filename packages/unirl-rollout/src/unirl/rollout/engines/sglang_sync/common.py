"""What every SGLang weight route shares: its stamp, bucketing, and the server's success check."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from torch import Tensor

from unirl.distributed.codec import Checksum
from unirl.distributed.errors import EmptyWeightSyncError, WeightSyncError
from unirl.types import WeightStamp


class Stamper:
    """Accumulates the stamp of the tensors a route ships, in shipping order."""

    def __init__(self) -> None:
        self.c = Checksum()
        self.nbytes = 0

    def add(self, name: str, t: Tensor) -> None:
        self.c.update(name, t)
        self.nbytes += t.numel() * t.element_size()

    def stamp(self, version: int, where: str) -> WeightStamp:
        if self.c.count == 0:
            raise EmptyWeightSyncError(f"{where}: weight sync v{version} carried zero tensors")
        return WeightStamp(
            version=version, checksum=self.c.hexdigest(), num_tensors=self.c.count, num_bytes=self.nbytes
        )


def buckets(named: Iterable[tuple[str, Tensor]], max_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
    """Order-preserving buckets of at most ``max_bytes`` (an oversized tensor alone)."""
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if bucket and size + n > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


def lookahead(it: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    """``(item, is_last)`` pairs, holding one item back."""
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield prev, False
        prev = item
    yield prev, True


def check_ok(resp: Any, route: str, url: str) -> None:
    """WeightSyncError with the server's message unless ``resp`` reports ``success: true``."""
    ok = resp.get("success") if isinstance(resp, dict) else None
    if ok is not True:
        msg = resp.get("message", resp.get("error_message", resp)) if isinstance(resp, dict) else resp
        raise WeightSyncError(f"SGLang {url}{route} refused the update: {msg}")
