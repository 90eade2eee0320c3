"""resolve_sde_indices: determinism per step, window arithmetic, edge cases."""

import pytest
from pydantic import ValidationError

from unirl.types import DiffusionSamplingParams, KOfWindow, SlidingWindow


def params(**kw):
    return DiffusionSamplingParams(num_steps=10, height=16, width=16, **kw)


def test_all_steps():
    assert params().resolve_sde_indices(0) == list(range(10))


def test_ode_has_no_sde_steps():
    assert params(sde_strategy="ode").resolve_sde_indices(3) == []


def test_k_of_window_is_deterministic_per_step_and_inside_the_window():
    p = params(sde_schedule=KOfWindow(k=3, start=0.0, end=0.5, seed=7))
    first = p.resolve_sde_indices(4)
    assert first == p.resolve_sde_indices(4)  # same step -> same draw
    assert len(first) == 3 and len(set(first)) == 3 and first == sorted(first)
    assert set(first) <= {0, 1, 2, 3, 4}  # "3 of the first 5 of 10"
    draws = {tuple(p.resolve_sde_indices(s)) for s in range(30)}
    assert len(draws) > 1  # the draw changes with the step
    seen = {i for d in draws for i in d}
    assert seen == {0, 1, 2, 3, 4}


def test_k_of_window_window_arithmetic():
    # floor(0.25*10)=2 .. ceil(0.55*10)=6 -> steps 2..5 (4 steps); k=4 takes them all
    p = params(sde_schedule=KOfWindow(k=4, start=0.25, end=0.55))
    assert p.resolve_sde_indices(0) == [2, 3, 4, 5]


def test_k_larger_than_window_fails_at_construction():
    with pytest.raises(ValidationError, match=r"sde_schedule.k=6 exceeds the window of 5 steps"):
        params(sde_schedule=KOfWindow(k=6, end=0.5))


def test_sliding_window_advances_and_clamps():
    # size 4, overlap 1 -> shift 3; last valid start 10-4 = 6; starts 0, 3, 6(clamped from 6)
    p = params(sde_schedule=SlidingWindow(size=4, overlap=1, advance_every=2))
    assert p.resolve_sde_indices(0) == [0, 1, 2, 3]
    assert p.resolve_sde_indices(1) == [0, 1, 2, 3]
    assert p.resolve_sde_indices(2) == [3, 4, 5, 6]
    assert p.resolve_sde_indices(4) == [6, 7, 8, 9]
    assert p.resolve_sde_indices(100) == [6, 7, 8, 9]  # no cycle: stays at the end


def test_sliding_window_cycles():
    # size 3, no overlap -> shift 3, last start 7: starts 0, 3, 6, 7(clamped) then back to 0
    p = params(sde_schedule=SlidingWindow(size=3, cycle=True))
    got = [p.resolve_sde_indices(s)[0] for s in range(6)]
    assert got == [0, 3, 6, 7, 0, 3]


def test_bad_windows_are_clear_errors():
    with pytest.raises(ValidationError, match=r"overlap=3 must be < sde_schedule.size=3"):
        SlidingWindow(size=3, overlap=3)
    with pytest.raises(ValidationError, match=r"size=11 exceeds num_steps=10"):
        params(sde_schedule=SlidingWindow(size=11))
    with pytest.raises(ValidationError, match="start=0.6 must be < sde_schedule.end=0.5"):
        KOfWindow(k=1, start=0.6, end=0.5)
    with pytest.raises(ValueError, match="rollout step must be >= 0"):
        params().resolve_sde_indices(-1)


def test_pinned_sigmas_are_checked():
    with pytest.raises(ValidationError, match="sigmas has 3 values; num_steps=10 needs 11"):
        params(sigmas=[1.0, 0.5, 0.0])
    with pytest.raises(ValidationError, match="non-increasing"):
        DiffusionSamplingParams(num_steps=2, height=8, width=8, sigmas=[0.5, 1.0, 0.0])
