"""Round trips (JSON and binary) of arbitrary Samples, numpy and torch tensors, bf16."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from unirl.types import (
    ARSamplingParams,
    Conditions,
    DiffusionSamplingParams,
    ImagePrimitive,
    KOfWindow,
    LatentTrajectory,
    Part,
    Reward,
    Sample,
    SampleMetadata,
    TextPrimitive,
    TextSegment,
    decode_tensor,
    encode_tensor,
    from_bytes,
    from_json,
    list_from_bytes,
    to_bytes,
    to_json,
)

torch = pytest.importorskip("torch")

NP_DTYPES = ["float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool"]


def same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.bfloat16:  # compare bit patterns: NaN payloads included
        a, b = a.view(torch.int16), b.view(torch.int16)
    return a.numpy().tobytes() == b.numpy().tobytes()


arrays = st.sampled_from(NP_DTYPES).flatmap(
    lambda d: hnp.arrays(np.dtype(d), hnp.array_shapes(min_dims=1, max_dims=3, max_side=4))
)


@st.composite
def tensors(draw):
    a = draw(arrays)
    kind = draw(st.sampled_from(["numpy", "torch", "bf16"]))
    if kind == "numpy":
        return a
    if kind == "bf16":
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(a.copy())


@given(tensors())
@settings(max_examples=150, deadline=None)
def test_tensor_codec_round_trip_is_exact(t):
    for binary in (False, True):
        assert same(t, decode_tensor(encode_tensor(t, binary=binary)))


finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@st.composite
def samples(draw):
    T = draw(st.integers(1, 4))
    sde = sorted(draw(st.sets(st.integers(0, T - 1), min_size=1)))
    positions = sorted({j for j in sde} | {j + 1 for j in sde})
    lib = draw(st.sampled_from(["numpy", "torch", "bf16"]))
    lat = np.asarray(draw(hnp.arrays(np.float32, (len(positions), 2, 3), elements=finite)))
    latents = lat if lib == "numpy" else torch.from_numpy(lat)
    if lib == "bf16":
        latents = latents.to(torch.bfloat16)
    sig = sorted(draw(st.lists(st.floats(0, 1), min_size=T + 1, max_size=T + 1)), reverse=True)
    diff = Part(
        name="diffusion",
        parent="ar" if draw(st.booleans()) else None,
        segment=LatentTrajectory(
            latents=latents,
            positions=positions,
            sigmas=sig,
            sde_indices=sde,
            log_probs=np.asarray(draw(hnp.arrays(np.float32, (len(sde),), elements=finite))),
        ),
        conditions=Conditions(tensors={"prompt_embeds": torch.randn(3, 4)}),
        sampling_params=DiffusionSamplingParams(
            num_steps=T,
            height=8,
            width=8,
            sigmas=sig,
            sde_schedule=KOfWindow(k=1, seed=draw(st.integers(0, 9))),
        ),
        reward=Reward(total=draw(finite), components={"geneval": draw(finite)}),
        advantage=draw(st.none() | finite),
        status=draw(st.sampled_from(["pending", "completed", "truncated", "aborted"])),
        weight_version=draw(st.none() | st.integers(0, 2**40)),
        outputs=[ImagePrimitive(pixels=np.zeros((2, 2, 3), np.uint8))],
    )
    n = draw(st.integers(0, 5))
    ar = Part(
        name="ar",
        segment=TextSegment(
            prompt_ids=draw(st.lists(st.integers(0, 2**31), max_size=5)),
            response_ids=list(range(n)),
            log_probs=torch.randn(n),
            loss_mask=torch.ones(n, dtype=torch.bool),
            finish_reason=draw(st.sampled_from(["stop", "length"])),
        ),
        sampling_params=ARSamplingParams(max_new_tokens=8, stop=[draw(st.text(max_size=3))]),
        outputs=[TextPrimitive(text=draw(st.text(max_size=20)))],
    )
    parts = [ar, diff] if diff.parent else [diff]
    return Sample(
        id=draw(st.text(min_size=1, max_size=8)),
        group_id="g",
        inputs=[TextPrimitive(text=draw(st.text(max_size=30)))],
        parts=parts,
        metadata=SampleMetadata(index=draw(st.integers(0, 100)), spec={"count": 2, "colours": ["red"]}),
    )


def assert_same_sample(a: Sample, b: Sample) -> None:
    def walk(x, y):
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            assert same(x, y), (x, y)
        elif isinstance(x, dict):
            assert x.keys() == y.keys()
            for k in x:
                walk(x[k], y[k])
        elif isinstance(x, list):
            assert len(x) == len(y)
            for u, v in zip(x, y):
                walk(u, v)
        else:
            assert x == y

    walk(a.model_dump(), b.model_dump())


@given(samples())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_sample_round_trip_json_and_binary(s):
    assert_same_sample(s, from_json(Sample, to_json(s)))
    assert_same_sample(s, from_bytes(Sample, to_bytes(s)))
    assert_same_sample(s, list_from_bytes(Sample, to_bytes([s, s]))[1])


def test_binary_is_compact_for_large_tensors():
    s = Sample(
        id="x",
        group_id="g",
        parts=[Part(name="d", conditions=Conditions(tensors={"e": torch.zeros(1000, dtype=torch.float32)}))],
    )
    assert len(to_bytes(s)) < 4000 + 400  # raw bytes, no base64 blow-up
    assert len(to_json(s)) > 5000


def test_corrupt_binary_is_a_clear_error():
    with pytest.raises(ValueError, match="bad magic"):
        from_bytes(Sample, b"\x80\x04pickle")
    with pytest.raises(ValueError, match="corrupt"):
        from_bytes(Sample, b"URL1\xc1\xc1")


def test_encoded_tensor_with_wrong_byte_count_is_rejected():
    enc = encode_tensor(np.zeros((2, 2), np.float32))
    enc["shape"] = [3, 2]
    with pytest.raises(ValueError, match="has 16 bytes; dtype float32 and shape \\[3, 2\\] need 24"):
        decode_tensor(enc)
    with pytest.raises(ValueError, match="not valid base64"):
        decode_tensor({"dtype": "float32", "shape": [1], "data": "@@@"})
    with pytest.raises(ValueError, match="dtype 'complex64'"):
        decode_tensor({"dtype": "complex64", "shape": [1], "data": ""})
