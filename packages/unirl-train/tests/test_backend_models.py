"""FSDP2 wrapping of tiny real diffusers / transformers models: forward, backward, step on CPU."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.ema import EMAConfig
from unirl.train.lora import LoRAConfig
from unirl.train.optim import AdamWConfig


def tiny_sd3():
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        caption_projection_dim=16,
        pooled_projection_dim=8,
        pos_embed_max_size=8,
    )


def sd3_loss(model: torch.nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    out = model(
        hidden_states=torch.randn(2, 4, 8, 8, generator=g),
        encoder_hidden_states=torch.randn(2, 5, 16, generator=g),
        pooled_projections=torch.randn(2, 8, generator=g),
        timestep=torch.tensor([500.0, 250.0]),
        return_dict=False,
    )[0]
    return out.pow(2).mean()


def tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(cfg)


def qwen3_loss(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    return model(input_ids=ids, labels=ids).loss


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


@pytest.mark.parametrize(
    ("make", "loss_fn", "blocks"),
    [(tiny_sd3, sd3_loss, 2), (tiny_qwen3, qwen3_loss, 2)],
    ids=["sd3", "qwen3"],
)
def test_full_finetune_with_checkpointing_and_ema(make, loss_fn, blocks) -> None:
    torch.manual_seed(0)
    cfg = FSDPConfig(optimizer=AdamWConfig(lr=1e-3), gradient_checkpointing=True, ema=EMAConfig(decay=0.9))
    backend = cfg.build(make(), "cpu")
    assert backend.num_sharded_blocks == blocks  # one fully_shard per _no_split_modules block
    assert all(isinstance(p, DTensor) for p in backend.module.parameters())
    m = backend.module
    assert getattr(m, "is_activation_checkpointing", False) or m.gradient_checkpointing
    before = {n: full(p) for n, p in backend.trainable.items()}
    loss = loss_fn(backend.module)
    backend.backward(loss)
    stats = backend.step()
    assert torch.isfinite(loss) and stats.grad_norm > 0 and not stats.skipped_nonfinite
    moved = sum(not torch.equal(full(p), before[n]) for n, p in backend.trainable.items())
    assert moved > len(before) // 2
    with torch.no_grad(), backend.ema_weights():
        assert torch.isfinite(loss_fn(backend.module))


@pytest.mark.parametrize(
    ("make", "loss_fn", "targets"),
    [
        (tiny_sd3, sd3_loss, ["to_q", "to_k", "to_v", "to_out.0"]),
        (tiny_qwen3, qwen3_loss, ["q_proj", "v_proj"]),
    ],
    ids=["sd3", "qwen3"],
)
def test_lora_on_attention_projections(make, loss_fn, targets) -> None:
    torch.manual_seed(0)
    cfg = FSDPConfig(
        optimizer=AdamWConfig(lr=1e-2),
        lora=LoRAConfig(r=2, alpha=2.0, target_modules=targets),
        reference="lora_base",
    )
    backend = cfg.build(make(), "cpu")
    assert backend.trainable and all("lora_" in n for n in backend.trainable)
    with torch.no_grad(), backend.reference_weights():
        ref0 = loss_fn(backend.module)
    for _ in range(2):  # B starts at 0: the second step is the first that changes the output
        backend.backward(loss_fn(backend.module))
        backend.step()
    with torch.no_grad():
        with backend.reference_weights():
            ref1 = loss_fn(backend.module)
        trained = loss_fn(backend.module)
    assert ref1.item() == pytest.approx(ref0.item(), abs=1e-6)
    assert trained.item() != pytest.approx(ref0.item(), abs=1e-6)
    merged = backend.full_state_dict()
    assert not any("lora_" in k for k in merged)
