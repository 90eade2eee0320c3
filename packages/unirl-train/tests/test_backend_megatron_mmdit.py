"""The SD3 MMDiT on megatron-core (`MegatronMMDiTBackend`) on CPU: world size 1 with gloo here and
2 in spawned processes for tensor parallelism.

- the TrainBackend contract, on a tiny SD3Transformer2DModel;
- the megatron-core model equals the diffusers one: forward (fp32, 1e-6) and the gradient of
  every diffusers weight (1e-5 relative), with and without SD3.5's per-head QK RMS norms;
- diffusers -> megatron-core -> diffusers is bit-exact (weights and buffers);
- the same flow-matching step under FSDP2 and megatron gives the same updated weights;
- ``recompute: full`` gives the same gradient; resume == uninterrupted;
- TP=2 on two gloo ranks (heads and MLP split) equals TP=1: loss, every gradient, the step's
  weights, and its checkpoint state loads at TP=1;
- what the backend does not run is refused, naming the field, the value and the fix.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from unirl.train.backends.base import TrainBackend
from unirl.train.ema import EMAConfig
from unirl.train.optim import AdamWConfig
from unirl.train.testing import TrainBackendContract

pytest.importorskip("megatron.core")
diffusers = pytest.importorskip("diffusers")

from unirl.train.backends.megatron import MegatronConfig  # noqa: E402
from unirl.train.backends.megatron.dit_backend import MegatronMMDiTBackend  # noqa: E402

HERE = Path(__file__).resolve().parent


def sd3(qk_norm: str | None = None, seed: int = 0, **kw: object) -> torch.nn.Module:
    """A tiny SD3 MMDiT, weights perturbed off their init (adaLN-Zero starts at zero: every block
    would be the identity and a bug in it invisible)."""
    torch.manual_seed(seed)
    args = {
        "sample_size": 8,
        "patch_size": 2,
        "in_channels": 4,
        "out_channels": 4,
        "num_layers": 3,
        "attention_head_dim": 8,
        "num_attention_heads": 4,
        "joint_attention_dim": 16,
        "caption_projection_dim": 32,
        "pooled_projection_dim": 16,
        "pos_embed_max_size": 4,
        "qk_norm": qk_norm,
        **kw,
    }
    m = diffusers.SD3Transformer2DModel(**args)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m


class Inputs(dict):
    """The model's keyword inputs; a slice takes those samples of each (``batch()[:1]``)."""

    def __getitem__(self, key: object) -> object:
        if isinstance(key, slice):
            return Inputs({n: v[key] for n, v in self.items()})
        return super().__getitem__(key)


def inputs(seed: int = 1) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    return Inputs(
        {
            "hidden_states": torch.randn(2, 4, 8, 8, generator=g),
            "encoder_hidden_states": torch.randn(2, 5, 16, generator=g),
            "pooled_projections": torch.randn(2, 16, generator=g),
            "timestep": torch.tensor([300.0, 700.0]),
        }
    )


def velocity(module: torch.nn.Module, x: dict[str, torch.Tensor]) -> torch.Tensor:
    return module(**x, return_dict=False)[0]


def flow_loss(module: torch.nn.Module, seed: int = 1) -> torch.Tensor:
    """A flow-matching regression: the velocity against a fixed target."""
    x = inputs(seed)
    target = torch.randn(x["hidden_states"].shape, generator=torch.Generator().manual_seed(seed + 10))
    return (velocity(module, x) - target).square().mean()


def megatron(module: torch.nn.Module, **kw: object) -> TrainBackend:
    return MegatronConfig(optimizer=AdamWConfig(lr=kw.pop("lr", 1e-2)), **kw).build(module, "cpu")  # type: ignore[arg-type]


def diffusers_grads(backend: TrainBackend) -> dict[str, torch.Tensor]:
    """The backend's gradients under the diffusers names (TP-gathered)."""
    return backend._to_hf({n: p.grad for n, p in backend.trainable.items()})  # type: ignore[attr-defined]


def step_capturing_grads(b: TrainBackend) -> tuple[object, dict[str, torch.Tensor]]:
    """``b.step()`` and the reduced gradients it applied (diffusers names; collective)."""
    captured: dict[str, torch.Tensor] = {}
    reduce = b._reduce_grads  # type: ignore[attr-defined]

    def capture() -> None:
        reduce()
        captured.update(diffusers_grads(b))

    b._reduce_grads = capture  # type: ignore[attr-defined]
    return b.step(), captured


def assert_same_grads(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rel: float = 1e-5) -> None:
    assert set(got) == set(want)
    for n, w in want.items():
        err = (got[n] - w).abs().max() / w.abs().max().clamp_min(1e-12)
        assert err <= rel, f"{n}: relative gradient error {float(err):.2e}"


class TestMegatronMMDiTBackendContract(TrainBackendContract):
    def make(self, module: torch.nn.Module) -> TrainBackend:
        return megatron(module, lr=0.1, ema=EMAConfig(decay=0.5), reference="frozen_copy")

    def net(self) -> torch.nn.Module:
        return sd3()

    def batch(self) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return inputs()

    def out(self, module: torch.nn.Module, x: dict[str, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        return velocity(module, x)


@pytest.mark.parametrize("qk_norm", [None, "rms_norm"])
def test_megatron_core_blocks_equal_diffusers(qk_norm: str | None) -> None:
    ref, b = sd3(qk_norm), megatron(sd3(qk_norm))
    assert isinstance(b, MegatronMMDiTBackend)
    from unirl.train.backends.megatron.mmdit import MegatronJointBlock

    assert all(isinstance(blk, MegatronJointBlock) for blk in b.module.transformer_blocks)
    x = inputs()
    torch.testing.assert_close(velocity(b.module, x), velocity(ref, x), rtol=0, atol=1e-6)
    flow_loss(ref).backward()
    b.backward(flow_loss(b.module))
    assert_same_grads(diffusers_grads(b), {n: p.grad for n, p in ref.named_parameters()})


def test_diffusers_megatron_diffusers_round_trip_is_bit_exact() -> None:
    fresh = sd3(qk_norm="rms_norm").state_dict()
    sd = megatron(sd3(qk_norm="rms_norm")).full_state_dict()
    assert set(sd) == set(fresh) and "pos_embed.pos_embed" in sd  # weights and buffers
    assert all(torch.equal(sd[n], fresh[n]) for n in fresh)
    loaded = sd3(seed=5, qk_norm="rms_norm")
    loaded.load_state_dict(sd)  # the export loads into the diffusers model as is
    x = inputs()
    torch.testing.assert_close(velocity(loaded, x), velocity(sd3(qk_norm="rms_norm"), x), rtol=0, atol=0)


def test_flow_step_matches_fsdp2() -> None:
    """One AdamW step from the same loss: the same updated weights on both backends."""
    from unirl.train.backends.fsdp import FSDPConfig

    fsdp = FSDPConfig(optimizer=AdamWConfig(lr=1e-2)).build(sd3(), "cpu")
    meg = megatron(sd3())
    fsdp.backward(flow_loss(fsdp.module))
    meg.backward(flow_loss(meg.module))
    sf, sm = fsdp.step(), meg.step()
    assert sm.grad_norm == pytest.approx(sf.grad_norm, rel=1e-5)
    want, got = fsdp.full_state_dict(), meg.full_state_dict()
    for n, w in want.items():  # Adam's first step is ~lr per entry: m / sqrt(v) of a near-zero
        # gradient entry amplifies float noise (one entry in ~8k moved 5e-6 here)
        torch.testing.assert_close(got[n], w, rtol=0, atol=5e-5)


def test_recompute_full_gives_the_same_gradient() -> None:
    plain, rec = megatron(sd3()), megatron(sd3(), recompute="full")
    plain.backward(flow_loss(plain.module))
    rec.backward(flow_loss(rec.module))
    assert_same_grads(diffusers_grads(rec), diffusers_grads(plain), rel=1e-6)


def test_resume_equals_uninterrupted() -> None:
    def run(b: TrainBackend, steps: range) -> None:
        for s in steps:
            b.backward(flow_loss(b.module, seed=s))
            b.step()

    kw = {"ema": EMAConfig(decay=0.5), "reference": "frozen_copy"}
    whole = megatron(sd3(), **kw)
    run(whole, range(3))
    first = megatron(sd3(), **kw)
    run(first, range(2))
    resumed = megatron(sd3(seed=9), **kw)  # other initial weights: all of them come from the state
    resumed.load_state_dict(first.state_dict())
    run(resumed, range(2, 3))
    a, b = whole.state_dict(), resumed.state_dict()
    assert a["global_step"] == b["global_step"] == 3
    for key in ("model", "ema", "reference"):
        assert all(torch.equal(a[key][n], b[key][n]) for n in a[key]), key
    for k in ("exp_avg", "exp_avg_sq"):
        assert all(torch.equal(a["optimizer"][k][n], v) for n, v in b["optimizer"][k].items())


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"pipeline_model_parallel_size": 2}, r"pipeline_model_parallel_size=2 .* use 1"),
        ({"recompute": "selective"}, r"recompute='selective' .* use 'full'"),
    ],
)
def test_refuses_what_it_does_not_run(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        megatron(sd3(), **kw)


def test_refuses_dual_attention_blocks() -> None:
    with pytest.raises(ValueError, match=r"dual_attention_layers=\(0,\)\).* use kind: fsdp"):
        megatron(sd3(dual_attention_layers=(0,)))


# -- tensor parallelism: two gloo ranks ----------------------------------------------------------


def _tp_worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    import conftest as tiny

    b = megatron(sd3(qk_norm="rms_norm"), tensor_model_parallel_size=2)
    shard = b.trainable["transformer_blocks.0.linear_qkv.weight"].shape
    loss = flow_loss(b.module)
    b.backward(loss)
    stats, grads = step_capturing_grads(b)
    weights, state = b.full_state_dict(), b.state_dict()  # collective
    if rank == 0:
        out = {
            "loss": loss.detach(),
            "grad_norm": torch.tensor(stats.grad_norm),
            "qkv_rows": torch.tensor(shard[0]),
            "grads": grads,
            "weights": weights,
            "state": state,
        }
        torch.save(out, Path(out_dir) / "tp2.pt")
    tiny.leave_world()


@pytest.mark.slow
def test_tensor_parallel_two_equals_one(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(
        _tp_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    two = torch.load(tmp_path / "tp2.pt", weights_only=True)
    one = megatron(sd3(qk_norm="rms_norm"))
    loss = flow_loss(one.module)
    one.backward(loss)
    stats, g1 = step_capturing_grads(one)
    assert int(two["qkv_rows"]) * 2 == one.trainable["transformer_blocks.0.linear_qkv.weight"].shape[0]
    assert float(two["loss"]) == pytest.approx(float(loss), abs=1e-6)
    assert float(two["grad_norm"]) == pytest.approx(stats.grad_norm, rel=1e-5)  # type: ignore[attr-defined]
    assert_same_grads(two["grads"], g1)  # the QK norms' partial gradients summed over TP too
    w1 = one.full_state_dict()
    for n, w in w1.items():  # Adam's first step is ~lr (1e-2) per entry: m / sqrt(v) of a tiny
        # gradient entry amplifies the TP run's float noise; 1% of a step allowed
        torch.testing.assert_close(two["weights"][n], w, rtol=0, atol=1e-4)
    resumed = megatron(sd3(seed=3, qk_norm="rms_norm"))  # TP=2 state resumes at TP=1
    resumed.load_state_dict(two["state"])
    assert resumed.global_step == 1
    got = resumed.full_state_dict()
    assert all(torch.equal(got[n], two["weights"][n]) for n in w1)


# -- CUDA ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_blocks_equal_diffusers_and_train_in_bf16() -> None:
    """On CUDA: fp32 (TF32 off) equal to diffusers as on CPU; bf16 compute (the default there)
    within bf16 rounding of it; a step moves the weights and the export stays diffusers-named."""
    cuda = torch.device("cuda")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        x = {k: v.to(cuda) for k, v in inputs().items()}
        ref = sd3(qk_norm="rms_norm").to(cuda)
        want = velocity(ref, x)
        fp32 = MegatronConfig(optimizer=AdamWConfig(lr=1e-2), precision={"param_dtype": "float32"}).build(
            sd3(qk_norm="rms_norm"), cuda
        )
        torch.testing.assert_close(velocity(fp32.module, x), want, rtol=0, atol=1e-5)
        bf16 = MegatronConfig(optimizer=AdamWConfig(lr=1e-2)).build(sd3(qk_norm="rms_norm"), cuda)
        got = velocity(bf16.module, x)
        assert got.dtype == torch.float32  # the diffusers output layer runs outside autocast
        assert float((got - want).abs().max()) < 3e-2 * float(want.abs().max())
        before = bf16.full_state_dict()
        target = torch.zeros_like(want)
        bf16.backward((velocity(bf16.module, x) - target).square().mean())
        assert not bf16.step().skipped_nonfinite
        after = bf16.full_state_dict()
        assert set(after) == set(ref.state_dict())
        assert any(not torch.equal(after[n], before[n]) for n in before)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
