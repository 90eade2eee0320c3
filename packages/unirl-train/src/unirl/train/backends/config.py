"""`BackendConfig`: the recipe's `backend` section, ``kind: fsdp`` (the default) or ``kind: megatron``."""

from __future__ import annotations

from typing import Annotated

from pydantic import Discriminator, Tag

from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.backends.megatron.config import MegatronConfig
from unirl.types.base import kind_or

BackendConfig = Annotated[
    Annotated[FSDPConfig, Tag("fsdp")] | Annotated[MegatronConfig, Tag("megatron")],
    Discriminator(kind_or("fsdp")),
]

__all__ = ["BackendConfig", "FSDPConfig", "MegatronConfig"]
