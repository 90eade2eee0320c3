"""`TrainBackendContract`: the test class every TrainBackend passes (subclass it, implement `make`).

```python
class TestMyBackend(TrainBackendContract):
    def make(self, module): return MyConfig(optimizer=AdamWConfig(lr=0.1), ...).build(module, "cpu")
```
The default module is a toy MLP; a backend for a particular kind of model overrides `net`,
`batch` and `out`. Shipped in the package (not tests/) so out-of-tree backends run the same contract.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.tensor import DTensor

from unirl.train.backends.base import StepStats, TrainBackend


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


class TrainBackendContract:
    """Subclass and implement `make(module)`: a backend with lr 0.1, EMA and a frozen reference.
    A backend that trains a particular kind of model also overrides `net`, `batch` and `out`."""

    def make(self, module: torch.nn.Module) -> TrainBackend:
        raise NotImplementedError

    def net(self) -> torch.nn.Module:
        """The module to train, freshly built from one seed (equal weights on every call)."""
        return net()

    def batch(self) -> torch.Tensor:
        return torch.ones(2, 3)

    def out(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return module(x)

    def loss(self, b: TrainBackend, scale: float = 1.0) -> torch.Tensor:
        return self.out(b.module, self.batch()).pow(2).sum() * scale

    def test_is_a_train_backend(self) -> None:
        b = self.make(self.net())
        assert isinstance(b, TrainBackend) and b.global_step == 0 and 0 <= b.rank < b.world_size

    def test_step_applies_and_counts(self) -> None:
        b = self.make(self.net())
        before = {n: full(p) for n, p in b.module.named_parameters()}
        b.backward(self.loss(b))
        s = b.step()
        assert isinstance(s, StepStats) and not s.skipped_nonfinite
        assert s.global_step == b.global_step == 1 and s.lr == pytest.approx(0.1) and s.grad_norm > 0
        assert all(not torch.equal(full(p), before[n]) for n, p in b.module.named_parameters())

    def test_zero_grad_drops_gradients(self) -> None:
        b = self.make(self.net())
        b.backward(self.loss(b, scale=math.nan))
        b.zero_grad()
        b.backward(self.loss(b))
        assert not b.step().skipped_nonfinite

    def test_nonfinite_step_is_skipped(self) -> None:
        b = self.make(self.net())
        before = {n: full(p) for n, p in b.module.named_parameters()}
        b.backward(self.loss(b, scale=math.inf))
        s = b.step()
        assert s.skipped_nonfinite and b.global_step == 0
        assert all(torch.equal(full(p), before[n]) for n, p in b.module.named_parameters())

    def test_all_reduce(self) -> None:
        b = self.make(self.net())
        assert b.all_reduce([1.0, 2.0]) == [1.0 * b.world_size, 2.0 * b.world_size]
        assert b.all_reduce([3.0], op="max") == [3.0]

    def test_weight_contexts_restore(self) -> None:
        b = self.make(self.net())
        b.backward(self.loss(b))
        b.step()
        trained = {n: full(p) for n, p in b.module.named_parameters()}
        x = self.batch()[:1]
        with torch.no_grad():
            out = self.out(b.module, x)
            with b.reference_weights():
                ref = self.out(b.module, x)
            with b.ema_weights():
                ema = self.out(b.module, x)
            torch.testing.assert_close(self.out(self.net(), x), ref)
            assert not torch.allclose(out, ref) and not torch.allclose(out, ema)
        assert all(torch.equal(full(p), trained[n]) for n, p in b.module.named_parameters())

    def test_state_round_trip(self) -> None:
        b = self.make(self.net())
        b.backward(self.loss(b))
        b.step()
        state = b.state_dict()
        snap = {n: full(p) for n, p in b.module.named_parameters()}
        b.backward(self.loss(b))
        b.step()
        b.load_state_dict(state)
        assert b.global_step == 1
        assert all(torch.equal(full(p), snap[n]) for n, p in b.module.named_parameters())

    def test_full_state_dict_has_module_keys(self) -> None:
        b = self.make(self.net())
        sd = b.full_state_dict()
        assert set(sd) == set(self.net().state_dict()) and all(
            not isinstance(v, DTensor) for v in sd.values()
        )
