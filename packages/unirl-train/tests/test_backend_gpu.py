"""CUDA paths of FSDPBackend: NCCL process group, bf16 compute / fp32 reduce, fused AdamW, LoRA,
checkpoint round trip with CUDA RNG. Marked `gpu`; skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from unirl.train import checkpoint as ckpt
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.ema import EMAConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.lora import LoRAConfig
from unirl.train.optim import AdamWConfig
from unirl.train.stack import TrainStack

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


class CudaBigram(torch.nn.Module):
    def __init__(self, tiny) -> None:
        super().__init__()
        self.policy = tiny.BigramPolicy()

    def forward(self, prev_BT: torch.Tensor) -> torch.Tensor:
        return self.policy(prev_BT.cuda()).float().cpu()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_cuda_backend_trains_and_resumes(tiny, tmp_path, lora: bool) -> None:
    torch.manual_seed(0)
    cfg = FSDPConfig(
        optimizer=AdamWConfig(lr=0.05),
        ema=EMAConfig(decay=0.9),
        lora=LoRAConfig(r=2, alpha=4.0, target_modules=["head"]) if lora else None,
        shard_modules=["BigramPolicy"],
    )
    backend = cfg.build(CudaBigram(tiny), "cuda")
    assert backend.config.precision.resolve(backend.device) == (torch.bfloat16, torch.float32)
    assert backend.optimizer.param_groups[0]["fused"]
    stack = TrainStack(
        backend, tiny.TokenPPO(), tiny.TokenPipeline(backend.module), BatchGeometry(micro_batch_size=2)
    )
    m = stack.train_on(tiny.token_parts(8))
    assert m["num_optimizer_steps"] == 1 and m["grad_norm"] > 0
    path = ckpt.save_checkpoint(tmp_path / "c", backend, extra={"cursor": 1})
    after = {n: p.full_tensor().clone() for n, p in backend.module.named_parameters()}
    stack.train_on(tiny.token_parts(8, seed=1))
    assert ckpt.load_checkpoint(path, backend) == {"cursor": 1}
    for n, p in backend.module.named_parameters():
        assert torch.equal(p.full_tensor(), after[n]), n
