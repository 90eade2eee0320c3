"""Tensor fields for the schema, and the safe tensor codec.

A tensor field holds a ``torch.Tensor`` or a ``numpy.ndarray`` exactly as given (no copy, no
conversion on the hot path). Serialised, a tensor is ``{"dtype", "shape", "data", "lib"}`` with
little-endian raw bytes in ``data`` (base64 text in JSON, raw bytes in the binary form), so any
reader can rebuild it without pickle. ``lib`` remembers whether it was a torch or a numpy tensor so
a round trip returns the same kind. bfloat16 is carried as its raw 16-bit pattern: exact.

torch is imported lazily: this module (and ``unirl.types``) imports without it.
"""

from __future__ import annotations

import base64
import sys
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import PlainSerializer, PlainValidator, SerializationInfo, WithJsonSchema

TensorLib = Literal["torch", "numpy"]

# Wire dtype name -> numpy dtype used for the bytes (bfloat16 travels as its uint16 bit pattern).
_NUMPY_DTYPES: dict[str, str] = {
    "float64": "<f8",
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "<u2",
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "int8": "i1",
    "uint8": "u1",
    "bool": "?",
}
SUPPORTED_DTYPES = tuple(_NUMPY_DTYPES)


def _torch() -> Any:
    """The torch module if it is already imported or importable, else None."""
    mod = sys.modules.get("torch")
    if mod is not None:
        return mod
    try:
        import torch
    except ImportError:
        return None
    return torch


def is_torch_tensor(x: object) -> bool:
    mod = sys.modules.get("torch")
    return mod is not None and isinstance(x, mod.Tensor)


def is_tensor(x: object) -> bool:
    """True for a numpy array or a torch tensor."""
    return isinstance(x, np.ndarray) or is_torch_tensor(x)


def dtype_name(x: Any) -> str:
    """The wire dtype name of a numpy array or torch tensor ("float32", "bfloat16", ...)."""
    name = str(x.dtype).removeprefix("torch.")
    if name not in _NUMPY_DTYPES:
        raise TypeError(
            f"tensor dtype {name!r} is not supported by the tensor codec; use one of {SUPPORTED_DTYPES}"
        )
    return name


def to_numpy(x: Any) -> np.ndarray:
    """A numpy view/copy of ``x`` (bfloat16 torch tensors become float32)."""
    if isinstance(x, np.ndarray):
        return x
    t = x.detach().cpu()
    if dtype_name(t) == "bfloat16":
        t = t.float()
    return np.asarray(t.numpy())


def to_torch(x: Any, device: Any = None, dtype: Any = None) -> Any:
    """``x`` as a torch tensor (shares memory with a numpy input when possible)."""
    torch = _torch()
    if torch is None:
        raise ImportError("to_torch needs torch: pip install 'unirl-types[torch]'")
    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
    return t.to(device=device, dtype=dtype) if (device is not None or dtype is not None) else t


def _raw_bytes(x: Any) -> bytes:
    name = dtype_name(x)
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).astype(_NUMPY_DTYPES[name], copy=False).tobytes()
    torch = _torch()
    t = x.detach().cpu().contiguous()
    if name == "bfloat16":
        t = t.view(torch.int16)
    arr: np.ndarray = t.numpy()
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def encode_tensor(x: Any, *, binary: bool = False) -> dict[str, Any]:
    """Encode a tensor as ``{"dtype", "shape", "lib", "data"}`` (data: bytes if binary else base64)."""
    raw = _raw_bytes(x)
    return {
        "dtype": dtype_name(x),
        "shape": list(x.shape),
        "lib": "numpy" if isinstance(x, np.ndarray) else "torch",
        "data": raw if binary else base64.b64encode(raw).decode("ascii"),
    }


def decode_tensor(d: dict[str, Any]) -> Any:
    """Inverse of :func:`encode_tensor`. Validates dtype, shape and byte length; never unpickles."""
    try:
        dtype, shape, data = d["dtype"], d["shape"], d["data"]
    except KeyError as e:
        raise ValueError(
            f"encoded tensor is missing key {e.args[0]!r}; expected dtype, shape, data"
        ) from None
    if dtype not in _NUMPY_DTYPES:
        raise ValueError(f"encoded tensor has dtype {dtype!r}; supported: {SUPPORTED_DTYPES}")
    if not isinstance(shape, list | tuple) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise ValueError(f"encoded tensor has shape {shape!r}; expected a list of non-negative ints")
    if isinstance(data, str):
        try:
            data = base64.b64decode(data, validate=True)
        except ValueError:
            raise ValueError("encoded tensor data is not valid base64") from None
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ValueError(f"encoded tensor data must be bytes or base64 text, got {type(data).__name__}")
    np_dtype = np.dtype(_NUMPY_DTYPES[dtype])
    count = int(np.prod(shape, dtype=np.int64))
    if len(data) != count * np_dtype.itemsize:
        raise ValueError(
            f"encoded tensor data has {len(data)} bytes; dtype {dtype} and shape {list(shape)} need "
            f"{count * np_dtype.itemsize}"
        )
    arr = np.frombuffer(bytes(data), dtype=np_dtype).reshape(shape)
    arr = arr.astype(np_dtype.newbyteorder("="), copy=True)  # native order, writable, owns its memory
    if dtype == "bfloat16":
        torch = _torch()
        if torch is None:
            raise ImportError("decoding a bfloat16 tensor needs torch: pip install 'unirl-types[torch]'")
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    if d.get("lib", "numpy") == "torch":
        torch = _torch()
        if torch is not None:
            return torch.from_numpy(arr)
    return arr


def _validate_tensor(v: Any) -> Any:
    if is_tensor(v):
        return v
    if isinstance(v, dict):
        return decode_tensor(v)
    # ValueError (not TypeError) so pydantic reports it as a ValidationError naming the field.
    raise ValueError(f"expected a torch.Tensor, numpy.ndarray or encoded tensor dict, got {type(v).__name__}")


def _serialize_tensor(v: Any, info: SerializationInfo) -> Any:
    if info.mode_is_json():
        return encode_tensor(v, binary=False)
    return v


_TENSOR_JSON_SCHEMA = {
    "type": "object",
    "title": "Tensor",
    "description": "Raw little-endian tensor bytes (base64 in JSON).",
    "properties": {
        "dtype": {"type": "string", "enum": list(SUPPORTED_DTYPES)},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "lib": {"type": "string", "enum": ["torch", "numpy"]},
        "data": {"type": "string", "contentEncoding": "base64"},
    },
    "required": ["dtype", "shape", "data"],
}

Tensor = Annotated[
    Any,
    PlainValidator(_validate_tensor),
    PlainSerializer(_serialize_tensor),
    WithJsonSchema(_TENSOR_JSON_SCHEMA),
]
"""A schema field holding a torch tensor or numpy array (kept as given)."""


def tensor_len(x: Any) -> int:
    return int(x.shape[0]) if len(x.shape) > 0 else 1


def is_finite(x: Any) -> bool:
    """True when every element is finite (non-float tensors are always finite)."""
    if isinstance(x, np.ndarray):
        return bool(np.isfinite(x).all()) if x.dtype.kind == "f" else True
    return bool(x.isfinite().all()) if x.is_floating_point() else True
