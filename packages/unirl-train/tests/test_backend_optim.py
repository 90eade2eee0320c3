"""LR schedules (worked numbers), AdamW construction and the precision policy."""

from __future__ import annotations

import pytest
import torch
from pydantic import TypeAdapter, ValidationError

from unirl.train.optim import (
    AdamWConfig,
    ConstantSchedule,
    CosineSchedule,
    LinearWarmupSchedule,
    ScheduleConfig,
    build_scheduler,
    phase_scheduler,
)
from unirl.train.precision import PrecisionConfig


def test_constant_and_linear_warmup_factors() -> None:
    assert [ConstantSchedule().factor(k) for k in range(3)] == [1.0, 1.0, 1.0]
    # (k + 1) / 4 until 1: the first step already uses lr / 4.
    assert [LinearWarmupSchedule(warmup_steps=4).factor(k) for k in range(6)] == [0.25, 0.5, 0.75, 1, 1, 1]


def test_cosine_factors_worked_example() -> None:
    s = CosineSchedule(total_steps=6, warmup_steps=2, min_lr_ratio=0.1)
    # warmup: 1/2, 2/2; then p = (k - 2) / 4 and f = 0.1 + 0.9 * 0.5 * (1 + cos(pi p)):
    # p=0 -> 1; p=.25 -> 0.1 + 0.45 * 1.7071068 = 0.8681981; p=.5 -> 0.55;
    # p=.75 -> 0.1 + 0.45 * 0.2928932 = 0.2318019; p>=1 -> 0.1.
    expected = [0.5, 1.0, 1.0, 0.8681981, 0.55, 0.2318019, 0.1, 0.1]
    assert [s.factor(k) for k in range(8)] == pytest.approx(expected, abs=1e-7)


def test_scheduler_drives_optimizer_lr() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = AdamWConfig(lr=0.2).build([p], torch.device("cpu"))
    sched = build_scheduler(opt, LinearWarmupSchedule(warmup_steps=4))
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(1)
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2])


def test_phase_scheduler_counts_the_phase_steps_and_starts_where_told() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = AdamWConfig(lr=0.2).build([p], torch.device("cpu"))
    old = build_scheduler(opt, LinearWarmupSchedule(warmup_steps=4))
    for _ in range(7):  # an earlier phase's steps: they do not shift the new phase's curve
        opt.step()
        old.step()
    cosine = CosineSchedule(total_steps=4, min_lr_ratio=0.1)
    seen = []
    sched = phase_scheduler(opt, cosine, 1e-2, step=1)  # a phase resumed at its step 1
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(1)
        opt.step()
        sched.step()
    # 1e-2 x the worked example's factors from p = 1/4: 0.8681981, 0.55, 0.2318019, then flat 0.1
    assert seen == pytest.approx([8.681981e-3, 5.5e-3, 2.318019e-3, 1e-3], rel=1e-6)
    assert sched.state_dict()["last_epoch"] == 5


def test_a_scheduler_rebuilt_at_a_resume_cursor_has_the_stepped_ones_state() -> None:
    # resume == uninterrupted: the checkpoint compare sees the whole state_dict, _step_count too
    cosine = CosineSchedule(total_steps=6, min_lr_ratio=0.1)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = AdamWConfig(lr=0.2).build([p], torch.device("cpu"))
    stepped = phase_scheduler(opt, cosine, 1e-2, step=0)
    for _ in range(3):
        opt.step()
        stepped.step()
    rebuilt = phase_scheduler(AdamWConfig(lr=0.2).build([p], torch.device("cpu")), cosine, 1e-2, step=3)
    assert rebuilt.state_dict() == stepped.state_dict() | {"lr_lambdas": rebuilt.state_dict()["lr_lambdas"]}
    assert rebuilt.state_dict()["_step_count"] == 4


def test_schedule_union_selects_by_kind_and_rejects_typos() -> None:
    ta = TypeAdapter(ScheduleConfig)
    assert isinstance(ta.validate_python({"kind": "cosine", "total_steps": 10}), CosineSchedule)
    with pytest.raises(ValidationError, match="linear_warmup"):
        ta.validate_python({"kind": "linear"})
    with pytest.raises(ValidationError, match="warmup_step"):
        ta.validate_python({"kind": "linear_warmup", "warmup_step": 3})
    with pytest.raises(ValidationError, match="warmup_steps=10 must be < scheduler.total_steps=10"):
        CosineSchedule(total_steps=10, warmup_steps=10)


def test_adamw_fused_on_cpu_matches_the_loop_and_rejects_empty() -> None:
    """The fused CPU kernel takes the steps torch's per-parameter loop takes (fp32 rounding)."""
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(5, 3, generator=gen), torch.randn(7, generator=gen)]
    grads = [[torch.randn_like(t) for t in init] for _ in range(4)]
    runs = []
    for fused in (True, False):
        ps = [torch.nn.Parameter(t.clone()) for t in init]
        opt = AdamWConfig(lr=1e-2, weight_decay=0.01, fused=fused).build(ps, torch.device("cpu"))
        assert bool(opt.param_groups[0]["fused"]) is fused
        assert opt.param_groups[0]["weight_decay"] == 0.01
        for step in grads:
            for p, g in zip(ps, step, strict=True):
                p.grad = g.clone()
            opt.step()
        runs.append(ps)
    for a, b, x in zip(*runs, init, strict=True):
        assert (a - x).abs().max() > 1e-2  # it moved: 4 steps of ~lr each
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="no trainable parameters"):
        AdamWConfig(lr=1e-3).build([], torch.device("cpu"))


def test_precision_auto_is_fp32_on_cpu_bf16_on_cuda() -> None:
    auto = PrecisionConfig()
    assert auto.resolve(torch.device("cpu")) == (torch.float32, torch.float32)
    assert auto.resolve(torch.device("cuda")) == (torch.bfloat16, torch.float32)
    assert PrecisionConfig(param_dtype="fp16").resolve(torch.device("cpu"))[0] == torch.float16
    policy = auto.policy(torch.device("cpu"))
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.float32, torch.float32)
