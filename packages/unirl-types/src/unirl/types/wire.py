"""The reward request/response wire schema (JSON over HTTP), shared by reward server and client.

No torch and no pickle: media travel as PNG/JPEG bytes or as a raw uint8 array, both base64 in
JSON. Every model is strict (`extra="forbid"`), so a typo in a field name is a 422 naming it.

A request carries a batch of items; the response carries one result per item, in order.
`request_id` makes a retry idempotent: the server answers a repeated id from its cache within
a TTL instead of scoring (and counting) the items twice.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)

from unirl.types.tensor import decode_tensor, dtype_name, encode_tensor

WIRE_SCHEMA_VERSION = 1
"""Bumped on any incompatible change of the models below."""

MAX_DIM = 8192
"""Largest height, width or frame count accepted for one image/video dimension."""


def _b64_to_bytes(value: object) -> object:
    """Accept base64 text (JSON) or raw bytes (Python); reject malformed base64 with a message."""
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ValueError(f"not valid base64 ({e}); encode bytes with base64.b64encode") from e
    return value


def _bytes_to_b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


Base64Data = Annotated[
    bytes,
    BeforeValidator(_b64_to_bytes),
    PlainSerializer(_bytes_to_b64, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "contentEncoding": "base64"}),
]
"""Bytes in Python, standard base64 text in JSON."""

_STRICT = ConfigDict(extra="forbid", frozen=True)


class EncodedImage(BaseModel):
    """An image as compressed file bytes (PNG or JPEG); decoded to uint8 HWC RGB by the server."""

    model_config = _STRICT
    kind: Literal["encoded"] = "encoded"
    format: Literal["png", "jpeg"]
    data: Base64Data = Field(min_length=1)


class ArrayData(BaseModel):
    """A raw uint8 array: `shape` [H, W, C] for an image or [T, H, W, C] for a video, C in {1, 3, 4}.

    The fields follow the safe tensor codec of `unirl.types.tensor` (dtype, shape, base64 data of
    the C-order bytes); its length must be the product of `shape`.
    """

    model_config = _STRICT
    kind: Literal["array"] = "array"
    dtype: Literal["uint8"] = "uint8"
    shape: list[int] = Field(min_length=3, max_length=4)
    data: Base64Data

    @model_validator(mode="after")
    def _check_size(self) -> ArrayData:
        if any(d <= 0 or d > MAX_DIM for d in self.shape):
            raise ValueError(f"shape {self.shape}: every dimension must be in [1, {MAX_DIM}]")
        if self.shape[-1] not in (1, 3, 4):
            raise ValueError(f"shape {self.shape}: last dimension (channels) must be 1, 3 or 4")
        expected = math.prod(self.shape)
        if len(self.data) != expected:
            raise ValueError(
                f"data has {len(self.data)} bytes but shape {self.shape} with dtype uint8 needs {expected}"
            )
        return self

    def to_numpy(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The array (decoded with the safe tensor codec of `unirl.types.tensor`)."""
        arr: np.ndarray[Any, np.dtype[np.uint8]] = decode_tensor(
            {"dtype": self.dtype, "shape": self.shape, "data": self.data, "lib": "numpy"}
        )
        return arr

    @classmethod
    def from_numpy(cls, array: Any) -> ArrayData:
        """Wrap a uint8 numpy array or torch tensor ([H, W, C] or [T, H, W, C]); TypeError for another dtype."""
        if dtype_name(array) != "uint8":
            raise TypeError(
                f"ArrayData needs dtype uint8, got {dtype_name(array)}; convert pixels to uint8 in [0, 255]"
            )
        enc = encode_tensor(array, binary=True)
        return cls(shape=enc["shape"], data=enc["data"])


WireImage = Annotated[EncodedImage | ArrayData, Field(discriminator="kind")]


class EncodedFrames(BaseModel):
    """A video as a list of encoded frames (all the same size)."""

    model_config = _STRICT
    kind: Literal["frames"] = "frames"
    frames: list[EncodedImage] = Field(min_length=1, max_length=MAX_DIM)


WireVideo = Annotated[EncodedFrames | ArrayData, Field(discriminator="kind")]

Scalar = str | int | float | bool
MetadataValue = Scalar | list[Scalar]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class WireItem(BaseModel):
    """One thing to score. Which fields a scorer needs depends on its modality.

    - `prompt`: the conditioning text (a text-to-image prompt, a question).
    - `response`: generated text to judge (an LLM answer).
    - `reference`: ground truth (a gold answer, the correct choice letter, an expected caption).
    - `image` / `video`: generated media.
    - `metadata`: scorer-specific scalars (e.g. GenEval-style spec fields).
    """

    model_config = _STRICT
    prompt: str | None = Field(default=None, max_length=100_000)
    response: str | None = Field(default=None, max_length=1_000_000)
    reference: str | None = Field(default=None, max_length=100_000)
    image: WireImage | None = None
    video: WireVideo | None = None
    metadata: dict[str, MetadataValue] = Field(default_factory=dict, max_length=64)


REQUEST_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"


class ScoreRequest(BaseModel):
    """POST /v1/score body."""

    model_config = _STRICT
    request_id: str | None = Field(
        default=None,
        pattern=REQUEST_ID_PATTERN,
        description="Idempotency key: a retry with the same id within the server's TTL is not rescored.",
    )
    items: list[WireItem] = Field(min_length=1, max_length=4096)


class WireScore(BaseModel):
    """The reward of one item: the weighted total and each scorer's (unweighted) value."""

    model_config = _STRICT
    total: FiniteFloat
    components: dict[str, FiniteFloat]


class ScoreResponse(BaseModel):
    """POST /v1/score answer: one `WireScore` per request item, in request order."""

    model_config = _STRICT
    request_id: str
    results: list[WireScore]
    identity: str = Field(description="Hash of scorer names, versions and weights (see GET /v1/version).")
    cached: bool = Field(default=False, description="True when answered from the idempotency cache.")


class ScorerInfo(BaseModel):
    """One scorer as the server describes it."""

    model_config = _STRICT
    name: str
    kind: str
    version: str
    weight: float
    modality: str
    output_range: tuple[float | None, float | None] = Field(
        description="Inclusive [low, high] of the scorer's total; null where unbounded."
    )


class VersionResponse(BaseModel):
    """GET /v1/version: what this server scores with; `identity` changes when anything here does."""

    model_config = _STRICT
    server_version: str
    wire_schema_version: int
    identity: str
    scorers: list[ScorerInfo]


class HealthResponse(BaseModel):
    """GET /health and GET /ready."""

    model_config = _STRICT
    status: Literal["ok", "not_ready"]


class ErrorResponse(BaseModel):
    """Any 4xx/5xx body: a message saying what was wrong and how to fix it."""

    model_config = _STRICT
    detail: str
