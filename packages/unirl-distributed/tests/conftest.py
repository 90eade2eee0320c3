"""Shared fixtures: one small local Ray cluster per test module that asks for it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _source_roots() -> list[str]:
    """Where this process imports unirl.* from, so Ray workers import the same code."""
    import unirl.distributed
    import unirl.types

    roots = []
    for mod in (unirl.distributed, unirl.types):
        for p in mod.__path__:
            roots.append(str(Path(p).parents[1]))
    return sorted(set(roots))


@pytest.fixture(scope="module")
def ray_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """ray.init(num_cpus=4) once for the module (fractional CPUs keep 2 real cores enough)."""
    import ray
    from ray import cloudpickle

    # test modules are imported by path (importlib mode): ship their classes to workers by value
    cloudpickle.register_pickle_by_value(sys.modules[request.module.__name__])
    # Workers inherit the environment the local cluster starts with (a runtime_env would make Ray
    # start fresh worker processes instead of its prestarted ones: ~3x slower on a loaded host).
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "OMP_NUM_THREADS")}
    os.environ["PYTHONPATH"] = os.pathsep.join([*_source_roots(), saved["PYTHONPATH"] or ""]).strip(
        os.pathsep
    )
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield ray
    finally:
        ray.shutdown()
        cloudpickle.unregister_pickle_by_value(sys.modules[request.module.__name__])
