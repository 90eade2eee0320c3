"""Pickle-free serialisation of schema models: JSON text and a compact msgpack binary form.

JSON carries tensors as ``{dtype, shape, lib, data: base64}``; the binary form carries the same
dicts with raw bytes, which msgpack stores without copying them through base64. Both round-trip
exactly (bf16 included) and are validated on load.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgpack
from pydantic import BaseModel, TypeAdapter

from unirl.types.tensor import encode_tensor, is_tensor

M = TypeVar("M", bound=BaseModel)

_MAGIC = b"URL1"  # unirl binary, format 1


def to_json(obj: BaseModel) -> str:
    return obj.model_dump_json()


def from_json(cls: type[M], text: str | bytes) -> M:
    return cls.model_validate_json(text)


def _raw(v: Any) -> Any:
    if is_tensor(v):
        return encode_tensor(v, binary=True)
    if isinstance(v, dict):
        return {k: _raw(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_raw(x) for x in v]
    return v


def to_bytes(obj: BaseModel | list[BaseModel]) -> bytes:
    """Binary form of one model or a list of models (e.g. a rollout batch of Samples)."""
    if isinstance(obj, list):
        payload: Any = [_raw(o.model_dump(mode="python")) for o in obj]
    else:
        payload = _raw(obj.model_dump(mode="python"))
    packed: bytes = msgpack.packb(payload, use_bin_type=True)
    return _MAGIC + packed


def _load(data: bytes) -> Any:
    if not data.startswith(_MAGIC):
        raise ValueError("not unirl binary data (bad magic); expected bytes from unirl.types.to_bytes")
    try:
        return msgpack.unpackb(data[len(_MAGIC) :], raw=False, strict_map_key=True)
    except (msgpack.UnpackException, ValueError) as e:
        raise ValueError(f"corrupt unirl binary data: {e}") from None


def from_bytes(cls: type[M], data: bytes) -> M:
    return cls.model_validate(_load(data))


def list_from_bytes(cls: type[M], data: bytes) -> list[M]:
    return TypeAdapter(list[cls]).validate_python(_load(data))  # type: ignore[valid-type]
