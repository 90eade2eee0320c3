"""Receiver process of the CUDA IPC fault sweep (imported by name in a spawned process).

It serves tickets from a queue until it gets ``None``: each request is ``(receiver_key, ticket)``;
a new key builds a fresh receiver (its own version gate), a known key reuses it. Each answer is
``("ok", version, loaded)`` or ``("error", "Type: message", loaded)`` where ``loaded`` is what
reached the sink, as CPU tensors in arrival order, so the parent can check nothing corrupted loaded.
"""

from __future__ import annotations

from typing import Any


def _sink_into(loaded: list[Any]) -> Any:
    def sink(bucket: dict[str, Any]) -> None:
        loaded.extend((name, t.cpu()) for name, t in bucket.items())

    return sink


def serve(requests: Any, answers: Any) -> None:
    import torch

    from unirl.distributed.weightsync import CudaIpcWeightSync

    receivers: dict[str, CudaIpcWeightSync] = {}
    while (request := requests.get()) is not None:
        key, ticket = request
        receiver = receivers.setdefault(key, CudaIpcWeightSync(name="engine"))
        loaded: list[tuple[str, torch.Tensor]] = []
        sink = _sink_into(loaded)
        try:
            ack = receiver.receive(ticket, sink)
            answers.put(("ok", ack.version, loaded))
        except Exception as exc:
            answers.put(("error", f"{type(exc).__name__}: {exc}", loaded))
