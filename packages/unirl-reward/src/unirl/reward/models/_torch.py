"""Small torch helpers shared by model scorers (imported only by them)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from unirl.reward.models._extras import require

T = TypeVar("T")

DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str) -> Any:
    torch = require("models", "torch")
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {name!r}")
    return getattr(torch, name)


def chunks(seq: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def model_device_dtype(model: Any) -> tuple[Any, Any]:
    p = next(model.parameters())
    return p.device, p.dtype
