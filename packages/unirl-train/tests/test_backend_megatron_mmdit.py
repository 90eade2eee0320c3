"""The SD3 and FLUX MMDiTs on megatron-core (`MegatronMMDiTBackend`) on CPU: world size 1 with gloo
here and 2 in spawned processes for tensor parallelism.

- the TrainBackend contract, on a tiny SD3Transformer2DModel and a tiny FluxTransformer2DModel;
- the megatron-core model equals the diffusers one: forward (fp32, 1e-6) and the gradient of
  every diffusers weight (1e-5 relative): SD3 with and without SD3.5's per-head QK RMS norms, and
  FLUX (double-stream blocks text-first with RoPE, single-stream blocks with the packed projection);
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
    return _perturbed(diffusers.SD3Transformer2DModel(**args))


def flux(seed: int = 0) -> torch.nn.Module:
    """A tiny FLUX.1 MMDiT: 2 double-stream and 2 single-stream blocks, RoPE over 3 axes."""
    torch.manual_seed(seed)
    m = diffusers.FluxTransformer2DModel(
        patch_size=1,
        in_channels=8,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=16,
        pooled_projection_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(2, 2, 4),
    )
    return _perturbed(m)


def _perturbed(m: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m


def model(kind: str, seed: int = 0) -> torch.nn.Module:
    """``sd3`` (no QK norms), ``sd3_qk`` (SD3.5's RMS QK norms) or ``flux``."""
    if kind == "flux":
        return flux(seed)
    return sd3("rms_norm" if kind == "sd3_qk" else None, seed)


_UNBATCHED = ("img_ids", "txt_ids")


class Inputs(dict):
    """The model's keyword inputs; a slice takes those samples of each (``batch()[:1]``)."""

    def __getitem__(self, key: object) -> object:
        if isinstance(key, slice):
            return Inputs({n: v if n in _UNBATCHED else v[key] for n, v in self.items()})
        return super().__getitem__(key)


def inputs(kind: str = "sd3", seed: int = 1) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    if kind == "flux":  # packed latents: 4 x 4 positions of 8 channels; timesteps in [0, 1]
        grid = torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij")
        return Inputs({
            "hidden_states": torch.randn(2, 16, 8, generator=g),
            "encoder_hidden_states": torch.randn(2, 5, 16, generator=g),
            "pooled_projections": torch.randn(2, 16, generator=g),
            "timestep": torch.tensor([0.3, 0.7]),
            "img_ids": torch.stack(grid, dim=-1).reshape(-1, 3),
            "txt_ids": torch.zeros(5, 3),
        })  # fmt: skip
    return Inputs({
        "hidden_states": torch.randn(2, 4, 8, 8, generator=g),
        "encoder_hidden_states": torch.randn(2, 5, 16, generator=g),
        "pooled_projections": torch.randn(2, 16, generator=g),
        "timestep": torch.tensor([300.0, 700.0]),
    })  # fmt: skip


def velocity(module: torch.nn.Module, x: dict[str, torch.Tensor]) -> torch.Tensor:
    return module(**x, return_dict=False)[0]


def flow_loss(module: torch.nn.Module, seed: int = 1, kind: str = "sd3") -> torch.Tensor:
    """A flow-matching regression: the velocity against a fixed target."""
    x = inputs(kind, seed)
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
    kind = "sd3"  # not sd3_qk: its last block's text-query norm gets no gradient (text output unused)

    def make(self, module: torch.nn.Module) -> TrainBackend:
        return megatron(module, lr=0.1, ema=EMAConfig(decay=0.5), reference="frozen_copy")

    def net(self) -> torch.nn.Module:
        return model(self.kind)

    def batch(self) -> Inputs:  # type: ignore[override]
        return inputs(self.kind)

    def out(self, module: torch.nn.Module, x: Inputs) -> torch.Tensor:  # type: ignore[override]
        return velocity(module, x)


class TestMegatronFluxBackendContract(TestMegatronMMDiTBackendContract):
    kind = "flux"


KINDS = ["sd3", "sd3_qk", "flux"]


@pytest.mark.parametrize("kind", KINDS)
def test_megatron_core_blocks_equal_diffusers(kind: str) -> None:
    ref, b = model(kind), megatron(model(kind))
    assert isinstance(b, MegatronMMDiTBackend)
    from unirl.train.backends.megatron.mmdit import MegatronJointBlock, MegatronSingleBlock

    assert all(isinstance(blk, MegatronJointBlock) for blk in b.module.transformer_blocks)
    if kind == "flux":
        assert all(isinstance(blk, MegatronSingleBlock) for blk in b.module.single_transformer_blocks)
    x = inputs(kind)
    torch.testing.assert_close(velocity(b.module, x), velocity(ref, x), rtol=0, atol=1e-6)
    flow_loss(ref, kind=kind).backward()
    b.backward(flow_loss(b.module, kind=kind))
    assert_same_grads(diffusers_grads(b), {n: p.grad for n, p in ref.named_parameters()})


@pytest.mark.parametrize("kind", ["sd3_qk", "flux"])
def test_diffusers_megatron_diffusers_round_trip_is_bit_exact(kind: str) -> None:
    fresh = model(kind).state_dict()
    sd = megatron(model(kind)).full_state_dict()
    assert set(sd) == set(fresh) and all(torch.equal(sd[n], fresh[n]) for n in fresh)
    if kind == "sd3_qk":
        assert "pos_embed.pos_embed" in sd  # the persistent buffer too
    loaded = model(kind, seed=5)
    loaded.load_state_dict(sd)  # the export loads into the diffusers model as is
    x = inputs(kind)
    torch.testing.assert_close(velocity(loaded, x), velocity(model(kind), x), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_flow_step_matches_fsdp2(kind: str) -> None:
    """One AdamW step from the same loss: the same updated weights on both backends."""
    from unirl.train.backends.fsdp import FSDPConfig

    fsdp = FSDPConfig(optimizer=AdamWConfig(lr=1e-2)).build(model(kind), "cpu")
    meg = megatron(model(kind))
    fsdp.backward(flow_loss(fsdp.module, kind=kind))
    meg.backward(flow_loss(meg.module, kind=kind))
    sf, sm = fsdp.step(), meg.step()
    assert sm.grad_norm == pytest.approx(sf.grad_norm, rel=1e-5)
    want, got = fsdp.full_state_dict(), meg.full_state_dict()
    for n, w in want.items():  # Adam's first step is ~lr per entry: m / sqrt(v) of a near-zero
        # gradient entry amplifies float noise (one entry in ~8k moved 5e-6 here)
        torch.testing.assert_close(got[n], w, rtol=0, atol=5e-5)


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_recompute_full_gives_the_same_gradient(kind: str) -> None:
    plain, rec = megatron(model(kind)), megatron(model(kind), recompute="full")
    plain.backward(flow_loss(plain.module, kind=kind))
    rec.backward(flow_loss(rec.module, kind=kind))
    assert_same_grads(diffusers_grads(rec), diffusers_grads(plain), rel=1e-6)


def test_resume_equals_uninterrupted() -> None:
    def run(b: TrainBackend, steps: range) -> None:
        for s in steps:
            b.backward(flow_loss(b.module, seed=s, kind="flux"))
            b.step()

    kw = {"ema": EMAConfig(decay=0.5), "reference": "frozen_copy"}
    whole = megatron(flux(), **kw)
    run(whole, range(3))
    first = megatron(flux(), **kw)
    run(first, range(2))
    resumed = megatron(flux(seed=9), **kw)  # other initial weights: all of them come from the state
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

TP_KINDS = ("sd3_qk", "flux")


def _tp_worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    import conftest as tiny

    out = {}
    for kind in TP_KINDS:
        b = megatron(model(kind), tensor_model_parallel_size=2)
        shard = b.trainable["transformer_blocks.0.linear_qkv.weight"].shape
        loss = flow_loss(b.module, kind=kind)
        b.backward(loss)
        stats, grads = step_capturing_grads(b)
        weights, state = b.full_state_dict(), b.state_dict()  # collective
        out[kind] = {
            "loss": loss.detach(),
            "grad_norm": torch.tensor(stats.grad_norm),  # type: ignore[attr-defined]
            "qkv_rows": torch.tensor(shard[0]),
            "grads": grads,
            "weights": weights,
            "state": state,
        }
    if rank == 0:
        torch.save(out, Path(out_dir) / "tp2.pt")
    tiny.leave_world()


@pytest.mark.slow
def test_tensor_parallel_two_equals_one(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(
        _tp_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    runs = torch.load(tmp_path / "tp2.pt", weights_only=True)
    for kind in TP_KINDS:
        two = runs[kind]
        one = megatron(model(kind))
        loss = flow_loss(one.module, kind=kind)
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
        resumed = megatron(model(kind, seed=3))  # TP=2 state resumes at TP=1
        resumed.load_state_dict(two["state"])
        assert resumed.global_step == 1
        got = resumed.full_state_dict()
        assert all(torch.equal(got[n], two["weights"][n]) for n in w1), kind


# -- CUDA ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["sd3_qk", "flux"])
def test_cuda_blocks_equal_diffusers_and_train_in_bf16(kind: str) -> None:
    """On CUDA: fp32 (TF32 off) equal to diffusers as on CPU; bf16 compute (the default there)
    within bf16 rounding of it; a step moves the weights and the export stays diffusers-named."""
    cuda = torch.device("cuda")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        x = {k: v.to(cuda) for k, v in inputs(kind).items()}
        ref = model(kind).to(cuda)
        want = velocity(ref, x)
        fp32 = MegatronConfig(optimizer=AdamWConfig(lr=1e-2), precision={"param_dtype": "fp32"}).build(
            model(kind), cuda
        )
        torch.testing.assert_close(velocity(fp32.module, x), want, rtol=0, atol=1e-5)
        bf16 = MegatronConfig(optimizer=AdamWConfig(lr=1e-2)).build(model(kind), cuda)
        got = velocity(bf16.module, x)
        assert got.dtype == torch.float32  # the diffusers output layer runs outside autocast
        assert float((got - want).abs().max()) < 3e-2 * float(want.abs().max())
        before = bf16.full_state_dict()
        bf16.backward(velocity(bf16.module, x).square().mean())
        assert not bf16.step().skipped_nonfinite
        after = bf16.full_state_dict()
        assert set(after) == set(ref.state_dict())
        assert any(not torch.equal(after[n], before[n]) for n in before)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
