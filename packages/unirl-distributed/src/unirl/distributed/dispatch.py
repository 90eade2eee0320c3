"""Dispatch modes of a Remote call, as pure functions over lists (no Ray, no processes).

- ``ALL`` (one-to-all): every worker gets the same arguments; the result is the list of every
  worker's return value, in global-rank order.
- ``DP`` (data-parallel scatter/gather): a list input is split into ``dp_size`` contiguous chunks
  (sizes differ by at most one, the first chunks take the remainder); every worker gets the chunk
  of its dp rank (tp/sp/pp peers get the same chunk); the outputs of one representative per dp
  rank (:attr:`RankInfo.is_dp_representative`) are concatenated in dp order, so the output lines
  up with the input.
- ``RANK0``: only global rank 0 runs the method; the result is its return value.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TypeVar

from unirl.distributed.rank import RankInfo

T = TypeVar("T")


class DispatchMode(enum.Enum):
    """How a call's arguments reach the workers and how their results come back."""

    ALL = "all"
    DP = "dp"
    RANK0 = "rank0"


def split_dp(items: Sequence[T], dp_size: int) -> list[list[T]]:
    """Split ``items`` into ``dp_size`` contiguous chunks; e.g. 5 items over dp=2 -> [3, 2]."""
    if dp_size < 1:
        raise ValueError(f"dp_size={dp_size} must be >= 1")
    if isinstance(items, str | bytes):
        raise TypeError("a DP-dispatched call takes a list of items, got a str/bytes")
    base, extra = divmod(len(items), dp_size)
    chunks: list[list[T]] = []
    start = 0
    for d in range(dp_size):
        size = base + (1 if d < extra else 0)
        chunks.append(list(items[start : start + size]))
        start += size
    return chunks


def scatter_dp(items: Sequence[T], ranks: Sequence[RankInfo]) -> list[list[T]]:
    """The chunk each worker (in ``ranks`` order) receives under DP dispatch."""
    if not ranks:
        raise ValueError("scatter_dp needs at least one worker")
    chunks = split_dp(items, ranks[0].dp_size)
    return [chunks[r.dp_rank] for r in ranks]


def gather_dp(outputs: Sequence[Sequence[T]], ranks: Sequence[RankInfo], where: str = "call") -> list[T]:
    """Concatenate the outputs of the dp representatives in dp order (inverse of :func:`scatter_dp`)."""
    if len(outputs) != len(ranks):
        raise ValueError(f"{where}: got {len(outputs)} outputs for {len(ranks)} workers")
    by_dp: dict[int, Sequence[T]] = {}
    for out, info in zip(outputs, ranks):
        if not info.is_dp_representative:
            continue
        if not isinstance(out, list | tuple):
            raise TypeError(
                f"{where}: a DP-dispatched method must return a list (one item per input item); "
                f"rank {info.rank} returned {type(out).__name__}"
            )
        by_dp[info.dp_rank] = out
    result: list[T] = []
    for d in range(ranks[0].dp_size):
        result.extend(by_dp[d])
    return result


def check_dp_lengths(
    chunks: Sequence[Sequence[object]], outputs: Sequence[Sequence[object]], where: str
) -> None:
    """A DP method must return exactly one output per input item; say which rank broke that."""
    for rank, (chunk, out) in enumerate(zip(chunks, outputs)):
        if isinstance(out, list | tuple) and len(out) != len(chunk):
            raise ValueError(
                f"{where}: rank {rank} got {len(chunk)} items but returned {len(out)}; a DP-dispatched "
                "method must return one output per input item, in order"
            )
