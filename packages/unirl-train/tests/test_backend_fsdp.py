"""FSDPBackend on CPU (gloo, world size 1): step, clipping, non-finite skip, EMA, reference."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.tensor import DTensor

from unirl.train.backends.base import TrainBackend
from unirl.train.backends.fsdp import FSDPBackend, FSDPConfig
from unirl.train.ema import EMAConfig
from unirl.train.optim import AdamWConfig, LinearWarmupSchedule


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def linear_backend(**kw) -> FSDPBackend:
    lin = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, -1.0]]))
    cfg = FSDPConfig(optimizer=AdamWConfig(lr=0.1), **kw)
    return cfg.build(lin, device="cpu")


def backward_xy(b: FSDPBackend, x=(3.0, 4.0)) -> None:
    b.backward(b.module(torch.tensor([x])).sum())  # d/dw (w . x) = x


def test_is_a_train_backend_and_params_are_sharded_dtensors() -> None:
    b = linear_backend()
    assert isinstance(b, TrainBackend)
    assert (b.rank, b.world_size, b.global_step) == (0, 1, 0)
    assert isinstance(b.module.weight, DTensor)


def test_clipping_uses_total_norm_and_reports_it() -> None:
    b = linear_backend(grad_clip=1.0)
    backward_xy(b)  # grad [3, 4], norm 5, clipped to [0.6, 0.8]
    stats = b.step()
    assert stats.grad_norm == pytest.approx(5.0)
    assert not stats.skipped_nonfinite and stats.global_step == 1 and stats.lr == pytest.approx(0.1)
    exp_avg = full(b.optimizer.state[b.module.weight]["exp_avg"])
    torch.testing.assert_close(exp_avg, torch.tensor([[0.06, 0.08]]))  # (1 - beta1) * clipped grad
    # AdamW's first step moves each weight by lr * sign(g) (bias-corrected m / sqrt(v) = +-1).
    torch.testing.assert_close(full(b.module.weight.detach()), torch.tensor([[0.9, -1.1]]), atol=1e-6, rtol=0)


def test_reset_optimizer_gives_a_fresh_adam_and_keeps_weights_and_step() -> None:
    def moved(reset: bool) -> torch.Tensor:
        b = linear_backend()
        for _ in range(2):  # large gradients along +x: large moments
            backward_xy(b, (300.0, 400.0))
            b.step()
        if reset:
            b.reset_optimizer()
            assert len(b.optimizer.state) == 0 and b.global_step == 2
        w = full(b.module.weight.detach()).clone()
        backward_xy(b, (-3e-3, -4e-3))  # a small gradient the other way
        b.step()
        assert b.global_step == 3
        return full(b.module.weight.detach()) - w

    # the old moments keep pushing the weights down; a fresh AdamW's first step is +lr * sign(-g)
    assert (moved(reset=False) < 0).all()
    torch.testing.assert_close(moved(reset=True), torch.tensor([[0.1, 0.1]]), atol=1e-5, rtol=0)


def test_step_reports_the_rate_it_applied_after_a_phase_changes_it() -> None:
    """A new phase's lr (``set_base_lr``, as RL after SFT) is what its first step applies and reports
    (it reported the previous phase's rate: the scheduler's last lr is stale until it steps)."""
    from unirl.train.optim import set_base_lr

    b = linear_backend()
    backward_xy(b)
    assert b.step().lr == pytest.approx(0.1)
    set_base_lr(b.optimizer, b.scheduler, 0.01)
    w = full(b.module.weight.detach()).clone()
    b.reset_optimizer()  # a fresh AdamW: its first step moves each weight by exactly lr
    backward_xy(b)
    assert b.step().lr == pytest.approx(0.01)
    torch.testing.assert_close(
        full(b.module.weight.detach()) - w, torch.tensor([[-0.01, -0.01]]), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nonfinite_grad_skips_the_step(bad: float) -> None:
    b = linear_backend(ema=EMAConfig(decay=0.5), scheduler=LinearWarmupSchedule(warmup_steps=2))
    before = full(b.module.weight.detach()).clone()
    backward_xy(b, x=(bad, 1.0))
    stats = b.step()
    assert stats.skipped_nonfinite and not math.isfinite(stats.grad_norm)
    assert stats.global_step == b.global_step == 0
    torch.testing.assert_close(full(b.module.weight.detach()), before)
    assert b.optimizer.state == {} or not b.optimizer.state[b.module.weight]
    assert b.scheduler.get_last_lr()[0] == pytest.approx(0.05)  # schedule did not advance
    assert all(p.grad is None for p in b.module.parameters())
    backward_xy(b)
    assert not b.step().skipped_nonfinite and b.global_step == 1


def test_ema_weights_context_through_backend() -> None:
    b = linear_backend(ema=EMAConfig(decay=0.75))
    backward_xy(b)
    b.step()  # w: [1, -1] -> [0.9, -1.1]; ema = 0.75 * [1, -1] + 0.25 * [0.9, -1.1]
    x = torch.tensor([[1.0, 0.0]])
    with torch.no_grad(), b.ema_weights():
        assert b.module(x).item() == pytest.approx(0.975, abs=1e-6)
    with torch.no_grad():
        assert b.module(x).item() == pytest.approx(0.9, abs=1e-6)


def test_frozen_copy_reference_is_the_initial_policy() -> None:
    b = linear_backend(reference="frozen_copy")
    backward_xy(b)
    b.step()
    x = torch.tensor([[1.0, 0.0]])
    with torch.no_grad(), b.reference_weights():
        assert b.module(x).item() == pytest.approx(1.0)
    with torch.no_grad():
        assert b.module(x).item() == pytest.approx(0.9, abs=1e-6)


def test_swapped_weights_are_read_when_forwards_keep_the_gathered_copy() -> None:
    """`reshard_after_forward: false` keeps each unit's gathered copy after a forward; the reference
    and EMA swaps write the sharded parameters, so the copy must be dropped around them (it was not:
    the reference forward read the policy, a KL of the policy to itself, found on the shapes world)."""
    b = linear_backend(reference="frozen_copy", ema=EMAConfig(decay=0.75), reshard_after_forward=False)
    backward_xy(b)
    b.step()  # w: [1, -1] -> [0.9, -1.1]; reference [1, -1]; ema 0.975 on x = [1, 0]
    x = torch.tensor([[1.0, 0.0]])
    with torch.no_grad():
        assert b.module(x).item() == pytest.approx(0.9, abs=1e-6)  # the policy forward keeps its copy
        with b.reference_weights():
            assert b.module(x).item() == pytest.approx(1.0)
        assert b.module(x).item() == pytest.approx(0.9, abs=1e-6)
        with b.ema_weights():
            assert b.module(x).item() == pytest.approx(0.975, abs=1e-6)
        assert b.module(x).item() == pytest.approx(0.9, abs=1e-6)


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_snapshot_reference_retakes_the_copy_and_checkpoints_keep_it(tmp_path, fmt: str) -> None:
    from unirl.train import checkpoint as ckpt

    x = torch.tensor([[1.0, 0.0]])
    b = linear_backend(reference="frozen_copy")
    backward_xy(b)
    b.step()  # "SFT": w0 = 0.9
    b.snapshot_reference()  # RL starts here: its reference is 0.9, not the build-time 1.0
    backward_xy(b)
    b.step()  # "RL": the policy moves on (0.8), the reference stays
    with torch.no_grad(), b.reference_weights():
        assert b.module(x).item() == pytest.approx(0.9, abs=1e-6)
    path = ckpt.save_checkpoint(tmp_path / "c", b, format=fmt)
    fresh = linear_backend(reference="frozen_copy")  # its build-time copy is 1.0
    ckpt.load_checkpoint(path, fresh)
    with torch.no_grad():
        assert fresh.module(x).item() == pytest.approx(0.8, abs=1e-6)
        with fresh.reference_weights():
            assert fresh.module(x).item() == pytest.approx(0.9, abs=1e-6)
    with pytest.raises(ValueError, match="snapshot_reference.*frozen_copy"):
        linear_backend().snapshot_reference()


def test_missing_features_give_clear_errors() -> None:
    b = linear_backend()
    with pytest.raises(ValueError, match="ema"):
        b.ema_weights()
    with pytest.raises(ValueError, match="frozen_copy"):
        b.reference_weights()
    with pytest.raises(ValueError, match="needs lora"):
        FSDPConfig(optimizer=AdamWConfig(lr=1.0), reference="lora_base").build(torch.nn.Linear(1, 1), "cpu")
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        FSDPConfig(optimizer=AdamWConfig(lr=1.0), gradient_checkpointing=True).build(
            torch.nn.Linear(1, 1), "cpu"
        )


def test_restart_ema_starts_at_the_weights_and_restarts_the_ramp() -> None:
    """After `restart_ema` the shadow equals the live weights, and the ramped decay counts its
    updates from there: d_0 = 0, so the first update copies the weights (NFT's on-policy start)."""
    b = linear_backend(ema=EMAConfig(decay=0.5, ramp=0.25))
    for _ in range(3):  # ramp: d = 0, 0.25, 0.5
        backward_xy(b)
        b.step()
    shadow = lambda: full(b.ema.shadow["weight"]).clone()  # noqa: E731
    w = lambda: full(b.module.weight.detach()).clone()  # noqa: E731
    assert not torch.allclose(shadow(), w())  # it lags the weights
    b.restart_ema()
    torch.testing.assert_close(shadow(), w())
    before = w()
    backward_xy(b)
    b.step()  # d_0 = 0 again (without the restart: d_3 = 0.5, half the old shadow)
    torch.testing.assert_close(shadow(), w())
    assert not torch.allclose(before, w())
    prev = w()
    backward_xy(b)
    b.step()  # d_1 = 0.25: shadow = 0.25 * prev + 0.75 * new
    torch.testing.assert_close(shadow(), 0.25 * prev + 0.75 * w())
    assert b.state_dict()["ema_start"] == 3
    b2 = linear_backend(ema=EMAConfig(decay=0.5, ramp=0.25))
    b2.load_state_dict(b.state_dict())
    assert b2._ema_start == 3
    torch.testing.assert_close(full(b2.ema.shadow["weight"]), shadow())


class _RopeBlock(torch.nn.Module):
    """A block that, like FLUX.2's, receives fp32 tables from its parent; records the input dtypes
    of every call (the forward and the recomputation in backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.seen: list[torch.dtype] = []

    def forward(self, h: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        self.seen.append(tables[0].dtype)
        return self.lin(h * tables[0] + tables[1])


class _RopeModel(torch.nn.Module):
    _no_split_modules = ("_RopeBlock",)

    def __init__(self) -> None:
        super().__init__()
        self.block = _RopeBlock()
        self.checkpointing = False

    def enable_gradient_checkpointing(self) -> None:
        self.checkpointing = True

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        tables = (torch.ones(4), torch.zeros(4))  # fp32, made inside the model
        if self.checkpointing and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self.block, h, tables, use_reentrant=False)
        return self.block(h, tables)


def test_checkpointed_blocks_recompute_with_the_inputs_cast_as_in_forward() -> None:
    """bf16 compute + gradient checkpointing: the recomputation sees the same (bf16) inputs as the
    forward, so backward does not fail with "Recomputed values ... have different metadata"
    (torch < 2.13 skipped FSDP2's cast there; FLUX.2 on the H200 hit it)."""
    from unirl.train.precision import PrecisionConfig

    model = _RopeModel()
    cfg = FSDPConfig(
        optimizer=AdamWConfig(lr=0.1),
        gradient_checkpointing=True,
        precision=PrecisionConfig(param_dtype="bf16"),
    )
    b = cfg.build(model, device="cpu")
    b.backward(b.module(torch.randn(2, 4)).float().sum())
    assert model.block.seen == [torch.bfloat16, torch.bfloat16]  # forward, then the recomputation
    assert b.step().grad_norm > 0
