"""`BackendConfig`: the recipe's `backend` section, ``kind: fsdp`` (the default) or ``kind: megatron``."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Tag

from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.backends.megatron.config import MegatronConfig


def _backend_kind(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("kind", "fsdp"))
    return str(getattr(value, "kind", "fsdp"))


BackendConfig = Annotated[
    Annotated[FSDPConfig, Tag("fsdp")] | Annotated[MegatronConfig, Tag("megatron")],
    Discriminator(_backend_kind),
]

__all__ = ["BackendConfig", "FSDPConfig", "MegatronConfig"]
