"""manual_gc: automatic collection off inside the phase, the step's cyclic garbage collected by
``collect()`` between steps, the pre-phase objects frozen out of it and returned on exit."""

from __future__ import annotations

import gc
import weakref

from unirl.train.step_gc import manual_gc


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a  # unreachable after return: only the cyclic collector frees it
    return weakref.ref(a)


def test_cycles_live_until_collect_then_go() -> None:
    assert gc.isenabled()
    with manual_gc() as collect:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        refs = [cycle() for _ in range(5000)]  # past every automatic threshold: none fires
        assert all(r() is not None for r in refs)
        collect()
        assert all(r() is None for r in refs)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_disabled_leaves_the_collector_alone() -> None:
    with manual_gc(False) as collect:
        assert gc.isenabled() and gc.get_freeze_count() == 0
        ref = cycle()
        collect()  # does nothing
        gc.collect()
        assert ref() is None


def test_a_collector_already_off_stays_off() -> None:
    gc.disable()
    try:
        with manual_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
