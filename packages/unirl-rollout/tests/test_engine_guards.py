"""Engine guards: sigma echo, log-prob parity, weight stamps (pure; worked numbers in comments)."""

from __future__ import annotations

import pytest
import torch

from unirl.rollout.engines.guards import (
    LogProbParityError,
    SigmaEchoError,
    StampMismatchError,
    check_sigma_echo,
    check_weight_stamp,
    logprob_parity,
    weight_stamp,
)
from unirl.rollout.schedules import static_shifted_sigmas


def test_sigma_echo_exact_and_float32_roundoff_pass() -> None:
    pinned = static_shifted_sigmas(10, 3.0)
    assert check_sigma_echo("s0", pinned, pinned) == 0.0
    # an engine computing in fp32 echoes values rounded to ~6e-8 relative: inside atol 1e-6
    echoed = torch.tensor(pinned, dtype=torch.float32).double().tolist()
    assert check_sigma_echo("s0", pinned, echoed) < 1e-7


def test_sigma_echo_names_sample_and_max_deviation() -> None:
    pinned = static_shifted_sigmas(10, 3.0)
    other = static_shifted_sigmas(10, 1.0)  # shift 1 instead of 3
    # step 1: shift 3 maps t=0.9 (roughly) to 3t/(1+2t) ~ 0.96, shift 1 leaves it ~ 0.9: deviations ~0.06..0.2
    worst = max(abs(a - b) for a, b in zip(pinned, other))
    with pytest.raises(SigmaEchoError, match=r"sample 's7'.*max deviation") as e:
        check_sigma_echo("s7", pinned, other)
    assert f"{worst:.3g}" in str(e.value)


def test_sigma_echo_length_and_nan() -> None:
    with pytest.raises(SigmaEchoError, match="echoed 2 sigmas.*has 3"):
        check_sigma_echo("a", [1.0, 0.5, 0.0], [1.0, 0.0])
    with pytest.raises(SigmaEchoError, match="non-finite"):
        check_sigma_echo("a", [1.0, 0.0], [float("nan"), 0.0])


def test_logprob_parity_metrics_worked_example() -> None:
    # |diff| = [0.1, 0.0] and [0.3] -> max 0.3 (sample 'b', position 0), mean (0.1 + 0 + 0.3) / 3
    eng = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5])]
    rep = [torch.tensor([-1.1, -2.0]), torch.tensor([-0.8])]
    m = logprob_parity(eng, rep, sample_ids=["a", "b"])
    assert m["parity/max_abs_diff"] == pytest.approx(0.3)
    assert m["parity/mean_abs_diff"] == pytest.approx(0.4 / 3)
    assert m["parity/count"] == 3
    with pytest.raises(LogProbParityError, match=r"0\.3.*sample 'b' position 0"):
        logprob_parity(eng, rep, max_abs_bound=0.2, sample_ids=["a", "b"])
    logprob_parity(eng, rep, max_abs_bound=0.31)


def test_logprob_parity_mask_padding_and_shape_checks() -> None:
    eng = torch.tensor([[-1.0, 99.0], [-2.0, -3.0]])  # 99 sits on padding
    rep = torch.tensor([[-1.0, 0.0], [-2.5, -3.0]])
    mask = torch.tensor([[True, False], [True, True]])
    m = logprob_parity(eng, rep, mask, max_abs_bound=0.6)
    assert m["parity/max_abs_diff"] == pytest.approx(0.5)
    assert m["parity/count"] == 3
    with pytest.raises(ValueError, match="must match"):
        logprob_parity([torch.zeros(2)], [torch.zeros(3)])
    with pytest.raises(LogProbParityError, match="non-finite"):
        logprob_parity([torch.tensor([float("inf")])], [torch.tensor([0.0])])


def test_weight_stamp_detects_any_change() -> None:
    a = [("w", torch.ones(2, 2)), ("b", torch.zeros(3))]
    s = weight_stamp(a, 4)
    assert (s.version, s.num_tensors, s.num_bytes) == (4, 2, 4 * 4 + 3 * 4)
    check_weight_stamp(weight_stamp(a, 4), s, "here")
    changed = [("w", torch.ones(2, 2)), ("b", torch.tensor([0.0, 0.0, 1e-7]))]
    with pytest.raises(StampMismatchError, match="v4 stamp mismatch"):
        check_weight_stamp(weight_stamp(changed, 4), s, "here")
    with pytest.raises(StampMismatchError):
        check_weight_stamp(weight_stamp(list(reversed(a)), 4), s, "here")
