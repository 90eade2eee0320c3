"""Sigma schedules against the real diffusers FlowMatchEulerDiscreteScheduler, value for value."""

from __future__ import annotations

import numpy as np
import pytest
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift as diffusers_calculate_shift
from pydantic import TypeAdapter, ValidationError

from unirl.rollout.schedules import (
    DynamicShiftSchedule,
    SigmaScheduleConfig,
    StaticShiftSchedule,
    calculate_shift,
    dynamic_shifted_sigmas,
    static_shifted_sigmas,
)


@pytest.mark.parametrize("steps", [1, 2, 10, 28, 40])
@pytest.mark.parametrize("shift", [1.0, 3.0, 5.0])
def test_static_matches_diffusers(steps: int, shift: float) -> None:
    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(steps)
    assert static_shifted_sigmas(steps, shift) == sched.sigmas.tolist()


def test_static_t10_shift3_is_not_linspace_to_zero() -> None:
    s = static_shifted_sigmas(10, 3.0)
    assert len(s) == 11 and s[0] == 1.0 and s[-1] == 0.0
    assert s[-2] == pytest.approx(0.0089, abs=5e-5)  # linspace(1, 0, 11) shifted would give 0.25


@pytest.mark.parametrize("steps", [4, 10, 28])
@pytest.mark.parametrize("seq_len", [16, 256, 1024, 4096])
def test_dynamic_matches_diffusers(steps: int, seq_len: int) -> None:
    mu = calculate_shift(seq_len)
    assert mu == diffusers_calculate_shift(seq_len)
    # the FLUX / Qwen-Image pipelines pass sigmas = linspace(1, 1/T, T)
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True)
    sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    assert dynamic_shifted_sigmas(steps, mu) == sched.sigmas.tolist()
    assert DynamicShiftSchedule().sigmas(steps, seq_len) == sched.sigmas.tolist()
    # plain set_timesteps(T, mu=mu) uses the scheduler's own grid
    sched.set_timesteps(steps, mu=mu)
    assert dynamic_shifted_sigmas(steps, mu, base_grid="scheduler") == sched.sigmas.tolist()
    # Qwen-Image style: linear time shift + shift_terminal
    q = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, shift_terminal=0.02, time_shift_type="linear"
    )
    q.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    assert (
        dynamic_shifted_sigmas(steps, mu, time_shift_type="linear", shift_terminal=0.02) == q.sigmas.tolist()
    )


def test_dynamic_mu_grows_with_resolution() -> None:
    # mu(256) = base_shift, mu(4096) = max_shift (worked from the linear formula)
    assert calculate_shift(256) == pytest.approx(0.5)
    assert calculate_shift(4096) == pytest.approx(1.15)
    lo, hi = DynamicShiftSchedule().sigmas(10, 256), DynamicShiftSchedule().sigmas(10, 4096)
    assert all(h >= low for h, low in zip(hi, lo))  # more tokens -> more time at high noise


def test_schedule_config_selection() -> None:
    ta: TypeAdapter[StaticShiftSchedule | DynamicShiftSchedule] = TypeAdapter(SigmaScheduleConfig)
    assert isinstance(ta.validate_python({"kind": "static_shift", "shift": 3.0}), StaticShiftSchedule)
    with pytest.raises(ValidationError):
        ta.validate_python({"kind": "static_shift", "shfit": 3.0})
    with pytest.raises(ValidationError):
        ta.validate_python({"kind": "karras"})
    with pytest.raises(ValueError, match="image_seq_len"):
        DynamicShiftSchedule().sigmas(10)
    with pytest.raises(ValueError, match="num_steps"):
        static_shifted_sigmas(0)
