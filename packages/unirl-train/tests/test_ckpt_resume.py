"""Checkpoints: atomic writes, contents, and resume == uninterrupted (bit-identical on CPU)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch.distributed.tensor import DTensor

from unirl.train import checkpoint as ckpt
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.ema import EMAConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.lora import LoRAConfig
from unirl.train.optim import AdamWConfig, CosineSchedule
from unirl.train.stack import TrainStack

CONFIGS = {
    "full": FSDPConfig(
        optimizer=AdamWConfig(lr=0.05, weight_decay=0.01),
        ema=EMAConfig(decay=0.9),
        scheduler=CosineSchedule(total_steps=10, warmup_steps=2, min_lr_ratio=0.1),
    ),
    "lora": FSDPConfig(
        optimizer=AdamWConfig(lr=0.05),
        ema=EMAConfig(decay=0.5, ramp=0.1),
        lora=LoRAConfig(r=2, alpha=4.0, dropout=0.25, target_modules=["head"]),
    ),
}


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def build(tiny, kind: str):
    torch.manual_seed(0)
    backend = CONFIGS[kind].build(tiny.BigramPolicy(), "cpu")
    geometry = BatchGeometry(micro_batch_size=2, mini_batch_size=4, num_updates_per_batch=2)
    return backend, TrainStack(backend, tiny.TokenPPO(), tiny.TokenPipeline(backend.module), geometry)


def one_round(tiny, stack) -> dict[str, float]:
    """A rollout stand-in that consumes the torch, numpy and python RNGs (like real data / sampling)."""
    parts = tiny.token_parts(8, seed=int(torch.randint(0, 10_000, ())))
    for p in parts:
        p.advantage = float(np.random.randn()) + random.random()
    return stack.train_on(parts)


def snapshot(backend) -> dict[str, torch.Tensor]:
    out = {f"p/{n}": full(p) for n, p in backend.module.named_parameters()}
    out.update({f"ema/{n}": full(t) for n, t in backend.ema.shadow.items()})
    for p, st in backend.optimizer.state.items():
        for k, v in st.items():
            out[f"opt/{id(p)}/{k}"] = full(v)
    return out


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_resume_is_bit_identical_to_uninterrupted(tiny, tmp_path, kind: str) -> None:
    backend, stack = build(tiny, kind)
    for _ in range(2):
        one_round(tiny, stack)
    ckpt.save_checkpoint(tmp_path / "ckpt", backend, extra={"cursor": 2, "weight_version": 4})
    tail_a = [one_round(tiny, stack) for _ in range(2)]
    params_a = {n: full(p) for n, p in backend.module.named_parameters()}
    ema_a = {n: full(t) for n, t in backend.ema.shadow.items()}

    torch.manual_seed(123)  # scramble every RNG: resume must restore them
    np.random.seed(123)
    random.seed(123)
    backend_b, stack_b = build(tiny, kind)
    extra = ckpt.load_checkpoint(tmp_path / "ckpt", backend_b)
    assert extra == {"cursor": 2, "weight_version": 4}
    assert backend_b.global_step == 8  # 2 rounds x 2 updates x 2 mini-batches
    tail_b = [one_round(tiny, stack_b) for _ in range(2)]
    assert backend_b.global_step == backend.global_step == 16
    for n, p in backend_b.module.named_parameters():
        assert torch.equal(full(p), params_a[n]), n
    for n, t in backend_b.ema.shadow.items():
        assert torch.equal(full(t), ema_a[n]), n
    assert [m["loss"] for m in tail_b] == [m["loss"] for m in tail_a]
    assert [m["lr"] for m in tail_b] == [m["lr"] for m in tail_a]


def test_lora_checkpoint_holds_only_adapter_weights(tiny, tmp_path) -> None:
    backend, stack = build(tiny, "lora")
    one_round(tiny, stack)
    path = ckpt.save_checkpoint(tmp_path / "c", backend)
    state = torch.load(path / "state.pt", weights_only=True)
    assert state["model"] and all("lora_" in k for k in state["model"])
    assert set(state["ema"]) == set(state["model"])
    assert json.loads((path / "meta.json").read_text()) == {
        "format_version": 1,
        "global_step": 4,
        "world_size": 1,
    }
    assert sorted(p.name for p in path.iterdir()) == ["extra.json", "meta.json", "rng-0.pt", "state.pt"]


def test_save_is_atomic_and_replaces(tiny, tmp_path, monkeypatch) -> None:
    backend, stack = build(tiny, "full")
    one_round(tiny, stack)
    target = tmp_path / "latest"
    ckpt.save_checkpoint(target, backend, extra={"cursor": 1})
    one_round(tiny, stack)

    real_save = torch.save

    def crash(obj, f, *a, **k):
        if str(f).endswith("state.pt"):
            raise OSError("disk full")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(target, backend, extra={"cursor": 2})
    monkeypatch.setattr(torch, "save", real_save)
    # the crashed save left the previous checkpoint intact
    assert json.loads((target / "extra.json").read_text()) == {"cursor": 1}
    assert json.loads((target / "meta.json").read_text())["global_step"] == 4

    ckpt.save_checkpoint(target, backend, extra={"cursor": 2})  # a later save replaces it
    assert json.loads((target / "extra.json").read_text()) == {"cursor": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]  # no temp or .old dirs left
    with pytest.raises(TypeError, match="JSON-serialisable"):
        ckpt.save_checkpoint(target, backend, extra={"cursor": object()})


def test_load_errors(tiny, tmp_path) -> None:
    backend, _ = build(tiny, "full")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ckpt.load_checkpoint(tmp_path / "missing", backend)
    lora_backend, _ = build(tiny, "lora")
    path = ckpt.save_checkpoint(tmp_path / "lora", lora_backend)
    with pytest.raises(ValueError, match="same lora config"):
        ckpt.load_checkpoint(path, backend)


def test_rng_roundtrip() -> None:
    state = ckpt.capture_rng_state()
    a = (torch.rand(3), np.random.rand(3), random.random())
    ckpt.restore_rng_state(state)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_buffers_round_trip(tmp_path) -> None:
    class WithBuffer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.register_buffer("scale", torch.tensor([2.0, 3.0]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.scale

    backend = FSDPConfig(optimizer=AdamWConfig(lr=0.1)).build(WithBuffer(), "cpu")
    path = ckpt.save_checkpoint(tmp_path / "b", backend)
    with torch.no_grad():
        backend.module.scale.fill_(0.0)
    ckpt.load_checkpoint(path, backend)
    torch.testing.assert_close(full(backend.module.scale), torch.tensor([2.0, 3.0]))
