"""LoRA: injection only into targets, only LoRA params train, base reference, merged weights."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.lora import LoRAConfig, adapter_state_dict, inject_lora, lora_disabled, lora_layers
from unirl.train.optim import AdamWConfig


class Attn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.to_q = torch.nn.Linear(4, 4)
        self.to_k = torch.nn.Linear(4, 4)
        self.ff = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(torch.tanh(self.to_q(x) * self.to_k(x)))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Attn(), Attn()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return x


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


CFG = LoRAConfig(r=2, alpha=4.0, target_modules=["to_q", "to_k"])


def test_injects_only_into_targets() -> None:
    net = inject_lora(Net(), CFG)
    assert sorted(lora_layers(net)) == [f"blocks.{i}.{m}" for i in (0, 1) for m in ("to_k", "to_q")]
    trainable = sorted(n for n, p in net.named_parameters() if p.requires_grad)
    assert trainable == sorted(
        f"blocks.{i}.{m}.lora_{ab}.default.weight" for i in (0, 1) for m in ("to_k", "to_q") for ab in "AB"
    )
    with pytest.raises(ValueError, match="target_modules"):
        inject_lora(Net(), LoRAConfig(r=2, alpha=2.0, target_modules=["nope"]))


def train_lora_backend(reference: str = "lora_base"):
    torch.manual_seed(0)
    backend = FSDPConfig(
        optimizer=AdamWConfig(lr=0.05), lora=CFG, reference=reference, shard_modules=["Attn"]
    ).build(Net(), "cpu")
    before = {n: full(p) for n, p in backend.module.named_parameters()}
    x = torch.randn(6, 4)
    for _ in range(3):
        backend.backward((backend.module(x) ** 2).mean())
        backend.step()
    return backend, before, x


def test_only_lora_params_change_and_base_reference_is_untouched() -> None:
    backend, before, x = train_lora_backend()
    assert backend.num_sharded_blocks == 2
    for n, p in backend.module.named_parameters():
        same = torch.equal(full(p), before[n])
        assert same != ("lora_" in n), n  # every LoRA weight moved, nothing else did
    torch.manual_seed(0)
    base = Net()  # same init as the wrapped model's base weights
    with torch.no_grad():
        with backend.reference_weights():
            ref_out = backend.module(x)
        trained_out = backend.module(x)
        torch.testing.assert_close(ref_out, base(x))
    assert not torch.allclose(trained_out, ref_out)
    assert all(p.requires_grad for n, p in backend.module.named_parameters() if "lora_" in n)


def test_merged_weights_reproduce_the_adapted_model() -> None:
    backend, _, x = train_lora_backend()
    merged = backend.full_state_dict(merge_lora=True)
    assert not any("lora_" in k or "base_layer" in k for k in merged)
    plain = Net()
    plain.load_state_dict(merged)  # strict: exactly the base model's keys
    with torch.no_grad():
        torch.testing.assert_close(plain(x), backend.module(x), atol=1e-5, rtol=1e-5)
    adapters = adapter_state_dict(backend.full_state_dict(merge_lora=False))
    assert sorted(adapters)[0] == "blocks.0.to_k.lora_A.weight" and len(adapters) == 8
    only = backend.lora_state_dict()  # gathers the adapters only
    assert sorted(only) == sorted(adapters)
    assert all(torch.equal(only[k], adapters[k]) for k in adapters)


def test_lora_disabled_requires_lora() -> None:
    with pytest.raises(ValueError, match="LoRA"), lora_disabled(Net()):
        pass
