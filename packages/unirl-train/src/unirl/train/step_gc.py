"""Python's cyclic garbage collector kept out of the steps (Megatron-LM's ``--manual-gc``).

CPython runs a collection whenever allocations pass a threshold, wherever that lands: inside a
train step a full collection walks every tracked object of the process (~400K after importing torch
and transformers: ~0.4 s on a CPU core). On the H100 GRPO benchmark (apps/benchmarks/gpu_grpo_step.py)
automatic collections inside the step spread its train phase over 0.70-1.06 s; with them moved
between steps, 0.68-0.89 s (docs/benchmarks.md, issue 22).

``manual_gc()`` is a phase's scope: on entry it collects once and freezes everything alive (modules,
optimizer state, imports: never garbage) into the permanent generation, then turns automatic
collection off; the ``collect`` it yields is called between steps and only walks what was allocated
since. On exit the frozen objects return to the collector and automatic collection is back on.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["manual_gc"]


@contextmanager
def manual_gc(enabled: bool = True) -> Iterator[Callable[[], object]]:
    """``with manual_gc() as collect: for ...: step(); collect()``. ``enabled=False``: the
    collector is left as it is and ``collect`` does nothing."""
    if not enabled:
        yield lambda: None
        return
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield gc.collect
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
