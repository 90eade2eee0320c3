"""Data plane in one process: handle transports and torch.distributed send/recv (two gloo ranks in threads)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from unirl.distributed.codec import TensorMeta, checksum, metas_from_bytes, metas_to_bytes, parse_dtype
from unirl.distributed.collective import StandaloneGroup, free_port
from unirl.distributed.transport import InProcessTransport, P2PTransport, TensorHandle, _decode


def payload() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "latents": torch.randn(2, 3, 4, generator=g),
        "log_probs": torch.randn(5, generator=g).to(torch.bfloat16),
        "ids": torch.arange(6).reshape(2, 3).t(),  # non-contiguous int64
        "scalar": torch.tensor(2.5),
    }


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


def test_in_process_transport_round_trip_and_handle_metadata() -> None:
    t = InProcessTransport()
    handle = t.put(payload())
    # 24*4 + 5*2 + 6*8 + 4 bytes
    assert handle.nbytes == 96 + 10 + 48 + 4
    assert handle.metas[1] == TensorMeta("log_probs", "bfloat16", (5,))
    got = t.get(handle)
    assert_same(got, payload())
    got["latents"].add_(1)  # the consumer owns a writable copy
    assert_same(t.get(handle), payload())


def test_decode_refuses_anything_but_byte_arrays() -> None:
    meta = (TensorMeta("x", "float32", (2,)),)
    with pytest.raises(TypeError, match="uint8 numpy array"):
        _decode(meta, [np.zeros(2, dtype=np.float32)])
    with pytest.raises(TypeError, match="list of 1 byte arrays"):
        _decode(meta, {"x": b"12345678"})
    with pytest.raises(ValueError, match="got 4 bytes"):
        _decode(meta, [np.zeros(4, dtype=np.uint8)])


def test_metadata_json_round_trip_and_allow_list() -> None:
    metas = [TensorMeta("a", "float16", (2, 3)), TensorMeta("b", "bool", ())]
    back, extra = metas_from_bytes(metas_to_bytes(metas, {"version": 3}))
    assert back == metas and extra == {"version": 3}
    with pytest.raises(ValueError, match="unknown tensor dtype 'object'"):
        parse_dtype("object")
    with pytest.raises(ValueError, match="malformed shape"):
        TensorMeta.from_json(["a", "float32", [-1]])


def test_checksum_sees_every_change() -> None:
    base = checksum(payload().items())
    assert base == checksum(payload().items())  # deterministic
    p = payload()
    p["latents"].view(torch.uint8).reshape(-1)[7] ^= 1  # one bit
    assert checksum(p.items()) != base
    p = payload()
    assert checksum(reversed(list(p.items()))) != base  # order
    p["scalar"] = p["scalar"].double()
    assert checksum(p.items()) != base  # dtype


def test_p2p_send_recv_between_two_gloo_ranks() -> None:
    port = free_port()
    with ThreadPoolExecutor(1) as ex:
        fut0 = ex.submit(StandaloneGroup, "gloo", "127.0.0.1", port, 0, 2, 30.0)
        g1 = StandaloneGroup("gloo", "127.0.0.1", port, 1, 2, 30.0)
        g0 = fut0.result(timeout=30)
        sent = ex.submit(P2PTransport(g0).send, payload(), 1)
        got = P2PTransport(g1).recv(0)
        sent.result(timeout=30)
    assert_same(got, payload())


def test_standalone_group_rejects_bad_rank() -> None:
    with pytest.raises(ValueError, match="rank=2 outside"):
        StandaloneGroup("gloo", "127.0.0.1", free_port(), 2, 2)
    assert isinstance(TensorHandle(0, ()).nbytes, int)


def test_sample_transport_round_trip_in_process() -> None:
    from unirl.distributed.transport import SampleTransport
    from unirl.types import LatentTrajectory, Part, Reward, Sample, TextPrimitive

    traj = LatentTrajectory(
        latents=torch.randn(2, 4, 3, 3),
        positions=[0, 1],
        sigmas=[1.0, 0.0],
        sde_indices=[0],
        log_probs=torch.tensor([-1.5]),
    )
    sample = Sample(
        id="s0",
        group_id="g0",
        inputs=[TextPrimitive(text="a red circle")],
        parts=[Part(name="diffusion", segment=traj, reward=Reward(total=0.5, components={}))],
    )
    t = SampleTransport(in_process=True)
    handle = t.put([sample, sample])
    back = t.get(handle)
    assert handle.count == 2 and [s.id for s in back] == ["s0", "s0"]
    seg = back[0].parts[0].segment
    assert isinstance(seg, LatentTrajectory) and torch.equal(torch.as_tensor(seg.latents), traj.latents)
