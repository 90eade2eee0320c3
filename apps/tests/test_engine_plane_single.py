"""The one-process run's push into a dedicated engine (``ARTrainer.sync_engine``) goes through the
``engine`` weight plane: stamped, echoed, and a no-op when the engine is up to date."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from unirl.apps.trainers.ar import ARTrainer
from unirl.distributed.weightsync import Endpoint, EngineSync, StampMismatchError, weight_stamp
from unirl.types import WeightStamp


class Engine:
    """A dedicated engine's weight update: loads, bumps its version, echoes the stamp it computed."""

    def __init__(self, corrupt: bool = False) -> None:
        self.weight_version = 0
        self.corrupt = corrupt
        self.pushes: list[int] = []

    def update_weights(self, named: Iterable[tuple[str, torch.Tensor]], stamp: WeightStamp) -> WeightStamp:
        items = [(n, t + 1 if self.corrupt else t) for n, t in named]
        self.weight_version = stamp.version
        self.pushes.append(stamp.version)
        return weight_stamp(items, stamp.version)


def trainer(engine: Engine, step: int) -> Any:
    weights = {"w": torch.arange(4.0), "b": torch.zeros(2)}
    backend = SimpleNamespace(global_step=step, full_state_dict=lambda: weights)
    plane = EngineSync().build(Endpoint("rollout engine", is_source=True, engine=engine))
    return SimpleNamespace(
        engine=engine, backend=backend, weight_plane=plane, rollout_weights=nullcontext, async_source=None
    )


def test_sync_engine_pushes_through_the_engine_plane_only_when_behind() -> None:
    engine = Engine()
    t = trainer(engine, step=2)
    m = ARTrainer.sync_engine(t)
    assert engine.pushes == [2] and m["weight_sync/version"] == 2.0
    assert t.weight_plane.last_stamp == weight_stamp([("w", torch.arange(4.0)), ("b", torch.zeros(2))], 2)
    assert ARTrainer.sync_engine(t) == {} and engine.pushes == [2]  # up to date: nothing pushed
    t.weight_plane = None  # trainside: no plane, nothing to push
    t.backend.global_step = 3
    assert ARTrainer.sync_engine(t) == {}


def test_sync_engine_fails_when_the_engine_loaded_other_bytes() -> None:
    with pytest.raises(StampMismatchError, match="rollout engine: weight sync v1 stamp mismatch"):
        ARTrainer.sync_engine(trainer(Engine(corrupt=True), step=1))
