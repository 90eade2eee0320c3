"""One AdamW step over the recipe's tiny shapes U-Net, sharded by FSDP2 (one process, CPU).

    python experiments/bench_adamw_cpu.py loop foreach fused    # prints the mean step time of each

The unfused CPU default is a Python loop over the parameters; on DTensors each tensor op goes
through DTensor dispatch, so the loop's cost grows with the number of tensors, not their size.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from unirl.apps.models import TinyShapesModelConfig


def main(modes: list[str]) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(2)
    cfg = TinyShapesModelConfig(
        kind="tiny_shapes",
        arch="unet",
        resolution=32,
        unet_channels=16,
        unet_coord_channels=True,
        unet_text_layers=2,
        text_pos_std=1.0,
    )
    model = cfg.build(torch.device("cpu"), 0).transformer
    fully_shard(model)
    params = [p for p in model.parameters() if p.requires_grad]
    print(f"{len(params)} tensors, {sum(p.numel() for p in params)} parameters")
    for mode in modes:
        kw = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[mode]
        opt = torch.optim.AdamW(params, lr=1e-4, **kw)
        for p in params:
            p.grad = torch.zeros_like(p)
        for _ in range(3):
            opt.step()
        t0 = time.perf_counter()
        for _ in range(20):
            opt.step()
        print(f"{mode} {(time.perf_counter() - t0) / 20 * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:] or ["loop", "foreach", "fused"])
