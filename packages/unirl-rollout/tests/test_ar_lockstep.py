"""Lockstep decoding across ranks (gloo, world size 2): equal forward counts, unchanged samples.

With FSDP-sharded weights every forward is a collective, so ranks whose batches finish at
different steps must keep stepping together; ``lockstep_group`` makes them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

WORKER = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from unirl.rollout.ar import ARPipeline, CausalLMBundle
    from unirl.types import ARSamplingParams, Sample, TextPrimitive

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    bundle = CausalLMBundle.tiny_qwen3(seed=0)
    calls = [0]
    bundle.model.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    params = ARSamplingParams(max_new_tokens=3 if rank == 0 else 11, stop_token_ids=[])

    def samples():
        return [Sample(id=f"r{rank}s{i}", group_id="g", inputs=[TextPrimitive(text="1+1=")]) for i in range(2)]

    locked = ARPipeline(bundle, params, sync_every=2, lockstep_group="world").generate(samples(), rollout_step=0)
    lock_calls, calls[0] = calls[0], 0
    alone = ARPipeline(bundle, params, sync_every=2).generate(samples(), rollout_step=0)
    same = [a.part("ar").segment.response_ids == b.part("ar").segment.response_ids for a, b in zip(locked, alone)]
    json.dump({"lock_calls": lock_calls, "alone_calls": calls[0], "same": same}, open(sys.argv[1], "w"))
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_lockstep_ranks_run_equal_forwards(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": "2",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / f"r{r}.json")], env={**env, "RANK": str(r)}
        )
        for r in range(2)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    r0, r1 = (json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2))
    # rank 0 needs 3 tokens (1 prefill + 2 steps), rank 1 needs 11 (1 + 10): in lockstep both run 11
    assert r0["alone_calls"] == 3 and r1["alone_calls"] == 11
    assert r0["lock_calls"] == r1["lock_calls"] == 11
    assert all(r0["same"]) and all(r1["same"])  # the extra steps do not change any sample
