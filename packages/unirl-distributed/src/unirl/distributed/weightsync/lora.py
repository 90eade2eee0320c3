"""LoRA-only sync: ship only adapter tensors through any inner WeightSync.

Names are matched by substring against PEFT's adapter parameter names (``lora_A``, ``lora_B``,
``lora_embedding_A/B``, ``lora_magnitude_vector`` for DoRA). Zero matches is an error: it means
LoRA was bound to zero modules (wrong ``target_modules``) and the engine would never change.
"""

from __future__ import annotations

from collections.abc import Sequence

from unirl.distributed.errors import EmptyWeightSyncError
from unirl.distributed.weightsync.protocol import NamedTensors, Sink, SyncAck, SyncTicket, WeightSync

LORA_MARKERS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")


def is_adapter(name: str, markers: Sequence[str] = LORA_MARKERS) -> bool:
    """True when ``name`` is a LoRA adapter parameter."""
    return any(m in name for m in markers)


class LoraOnlySync:
    """Wraps a WeightSync; ``push`` filters to adapter tensors, everything else delegates."""

    def __init__(self, inner: WeightSync, markers: Sequence[str] = LORA_MARKERS) -> None:
        self.inner = inner
        self.markers = tuple(markers)
        self.kind = inner.kind
        self.needs_ticket = inner.needs_ticket

    def push(self, params: NamedTensors, version: int) -> SyncTicket:
        """Ship only the adapter tensors of ``params``."""
        items = list(params)
        adapters = [(n, t) for n, t in items if is_adapter(n, self.markers)]
        if not adapters:
            raise EmptyWeightSyncError(
                f"LoRA-only weight sync v{version}: none of {len(items)} parameters matches {self.markers} "
                f"(e.g. {[n for n, _ in items[:3]]}); LoRA is bound to zero modules: check target_modules"
            )
        return self.inner.push(adapters, version)

    def receive(self, ticket: SyncTicket | None, sink: Sink) -> SyncAck:
        """Delegate to the inner receiver."""
        return self.inner.receive(ticket, sink)

    def confirm(self, ticket: SyncTicket, acks: Sequence[SyncAck], expected_receivers: int) -> None:
        """Delegate to the inner sender."""
        self.inner.confirm(ticket, acks, expected_receivers)
