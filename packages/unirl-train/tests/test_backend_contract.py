"""The TrainBackend contract (`unirl.train.testing.TrainBackendContract`) run by FSDPBackend."""

from __future__ import annotations

import torch

from unirl.train.backends.base import TrainBackend
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.ema import EMAConfig
from unirl.train.optim import AdamWConfig
from unirl.train.testing import TrainBackendContract


class TestFSDPBackendContract(TrainBackendContract):
    def make(self, module: torch.nn.Module) -> TrainBackend:
        cfg = FSDPConfig(optimizer=AdamWConfig(lr=0.1), ema=EMAConfig(decay=0.5), reference="frozen_copy")
        return cfg.build(module, "cpu")
