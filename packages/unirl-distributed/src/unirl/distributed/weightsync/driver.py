"""The driver's side of one weight sync between two Remotes (trainer -> engine).

Worker methods stay the user's; the driver only sequences them:
- ticket transports (``needs_ticket``): every trainer rank ``push``\\ es (DTensor gathers need all
  ranks; rank 0 is the source and returns the ticket), then every engine rank ``pull``\\ s it;
- streaming transports (broadcast): push and pull run concurrently, pull gets ``None``;
then trainer rank 0 ``confirm``\\ s every engine's ack (and frees the payload).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from unirl.distributed.remote import RemoteBase
from unirl.distributed.weightsync.protocol import SyncAck, SyncTicket

T = TypeVar("T")
E = TypeVar("E")


def drive_weight_sync(
    trainer: RemoteBase[T],
    engine: RemoteBase[E],
    *,
    push: Callable[[T, int], SyncTicket],
    pull: Callable[[E, SyncTicket | None], SyncAck],
    confirm: Callable[[T, SyncTicket, list[SyncAck], int], None],
    version: int,
    streaming: bool,
    timeout_s: float | None = 600.0,
) -> SyncTicket:
    """Run one versioned, verified sync; returns the source's ticket once every engine acked."""
    if streaming:
        pushed = trainer.call_all_async(push, version)
        pulled = engine.call_all_async(pull, None)
        acks = pulled.result(timeout_s)
        ticket = pushed.result(timeout_s)[0]
    else:
        ticket = trainer.call_all(push, version)[0]
        acks = engine.call_all_async(pull, ticket).result(timeout_s)
    trainer.call_rank0(confirm, ticket, acks, engine.world_size)
    return ticket
