"""GPU-only tests (marker ``gpu``; run on the device machine, never required by CI)."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

import pytest
import torch

from unirl.distributed.codec import checksum

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def cuda_params() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator(device="cuda").manual_seed(0)
    return [
        ("w", torch.randn(256, 128, device="cuda", generator=g)),
        ("b", torch.randn(128, device="cuda", generator=g).to(torch.bfloat16)),
        ("lora_A.weight", torch.randn(8, 128, device="cuda", generator=g).to(torch.float16)),
    ]


def run_child(ticket: object) -> tuple[str, object, str]:
    sys.path.insert(0, str(Path(__file__).parent))  # spawn children inherit sys.path
    import _gpu_child

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_gpu_child.receive, args=(ticket, out))
    proc.start()
    result = out.get(timeout=120)
    proc.join(timeout=60)
    return result  # type: ignore[no-any-return]  # queue items are untyped


def test_cuda_ipc_sync_to_another_process_is_bit_exact_and_verified() -> None:
    from unirl.distributed.weightsync import CudaIpcWeightSync

    sender = CudaIpcWeightSync(max_bucket_bytes=64 * 1024)
    params = cuda_params()
    ticket = sender.push(params, version=1)
    assert [len(b) for b in ticket.buckets] == [1, 2]  # 128 KiB alone, then 256 + 2 KiB
    status, ack, got_sum = run_child(ticket)
    assert status == "ok", ack
    assert got_sum == checksum((n, t.cpu()) for n, t in params)
    sender.confirm(ticket, [ack], 1)  # type: ignore[list-item]  # ack is a SyncAck from the child

    ticket2 = sender.push(params, version=2)
    next(iter(sender._buffers.values()))[5] ^= 0xFF  # corrupt the shared CUDA buffer of bucket 0
    torch.cuda.synchronize()
    status, err, _ = run_child(ticket2)
    assert status == "error" and "WeightSyncError" in str(err) and "bucket 0" in str(err)
    with pytest.raises(Exception, match="0 acks for 1 receivers"):
        sender.confirm(ticket2, [], 1)  # the failed receiver never acked; confirm still frees the buffers
    assert sender._buffers == {}
