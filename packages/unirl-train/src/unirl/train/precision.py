"""Precision policy: the dtype FSDP2 all-gathers parameters in and reduces gradients in.

Master weights and optimizer state always stay fp32 (the sharded parameters); only the
compute copy that FSDP2 all-gathers for forward/backward takes `param_dtype`.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

DTypeName = Literal["auto", "fp32", "bf16", "fp16"]

_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class PrecisionConfig(BaseModel):
    """Compute and gradient-reduction dtypes.

    `auto` means bf16 compute / fp32 reduction on CUDA and fp32 everywhere on CPU (CPU bf16
    matmuls are slow and the CPU tier checks exact invariances in fp32).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    param_dtype: DTypeName = "auto"
    reduce_dtype: DTypeName = "auto"

    def resolve(self, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
        """(param_dtype, reduce_dtype) for `device`."""
        on_cuda = device.type == "cuda"
        param = (
            _DTYPES[self.param_dtype]
            if self.param_dtype != "auto"
            else (torch.bfloat16 if on_cuda else torch.float32)
        )
        reduce = _DTYPES[self.reduce_dtype] if self.reduce_dtype != "auto" else torch.float32
        return param, reduce

    def policy(self, device: torch.device):  # -> MixedPrecisionPolicy
        """The FSDP2 `MixedPrecisionPolicy` for `device`."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        param, reduce = self.resolve(device)
        return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce, cast_forward_inputs=True)
