"""MegatronBackend (megatron-core GPTModel via mbridge) on CPU, world size 1 with gloo here and
2 in spawned processes for tensor parallelism.

- the TrainBackend contract, on a tiny Qwen3;
- HF -> Megatron -> HF is bit-exact; the rollout copy equals the trained weights after a sync;
- the same GRPO step under FSDP2 and Megatron (same weights, same rollout batch) gives the same
  loss (1e-6) and gradients (1e-5 relative, per Hugging Face weight), and ratio == 1 on the first
  update (the HF rollout's log-probs replayed through megatron-core);
- checkpoint state: resume == uninterrupted (weights, AdamW moments, EMA, reference);
- TP=2 and DP=2 on two gloo ranks equal one rank (loss, gradients); TP=2 checkpoint state (and a
  sharded checkpoint written at world size 2) loads at TP=1 / world size 1;
- the config refuses what the backend does not run, naming the field, the value and the fix.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

from unirl.rollout.ar.bundle import CausalLMBundle
from unirl.rollout.ar.pipeline import ARPipeline
from unirl.train.algorithms import GRPOConfig
from unirl.train.backends.base import TrainBackend
from unirl.train.backends.config import BackendConfig
from unirl.train.ema import EMAConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.optim import AdamWConfig
from unirl.train.stack import TrainStack
from unirl.train.testing import TrainBackendContract
from unirl.types import ARSamplingParams, Sample, TextPrimitive

pytest.importorskip("megatron.core")
pytest.importorskip("mbridge")

from unirl.train.backends.megatron import MegatronConfig

HERE = Path(__file__).resolve().parent
ADV = [1.0, -1.0, 0.5, -0.5]
TOKENS = torch.tensor([[5, 9, 3, 11, 7, 2], [8, 4, 4, 6, 10, 1]])


def qwen3() -> torch.nn.Module:
    return CausalLMBundle.tiny_qwen3(seed=0).model


def megatron(module: torch.nn.Module, device: str = "cpu", **kw) -> TrainBackend:
    return MegatronConfig(optimizer=AdamWConfig(lr=kw.pop("lr", 1e-2)), **kw).build(module, device)


class TestMegatronBackendContract(TrainBackendContract):
    def make(self, module: torch.nn.Module) -> TrainBackend:
        return megatron(module, lr=0.1, ema=EMAConfig(decay=0.5), reference="frozen_copy")

    def net(self) -> torch.nn.Module:
        return qwen3()

    def batch(self) -> torch.Tensor:
        return TOKENS

    def out(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return module(input_ids=x).logits


def test_hf_megatron_hf_round_trip_is_bit_exact() -> None:
    backend = megatron(qwen3())
    fresh = qwen3().state_dict()
    out = backend.full_state_dict()
    assert set(out) == set(fresh)
    assert all(torch.equal(out[n], fresh[n]) for n in fresh)
    stream = backend.named_hf_weights()  # what a weight plane streams: one weight at a time
    assert not isinstance(stream, dict)
    streamed = dict(stream)
    assert set(streamed) == set(fresh) - {"lm_head.weight"}  # a tied weight once
    assert all(torch.equal(streamed[n], fresh[n]) for n in streamed)
    with torch.no_grad():  # and the megatron-core forward is the Hugging Face one
        torch.testing.assert_close(
            backend.module(input_ids=TOKENS).logits, qwen3()(input_ids=TOKENS).logits, rtol=0, atol=2e-6
        )


def samples() -> list[Sample]:
    prompts = ["1+2=", "3+4="]
    return [
        Sample(id=f"p{g}-{i}", group_id=f"p{g}", inputs=[TextPrimitive(text=t)])
        for g, t in enumerate(prompts)
        for i in range(2)
    ]


def rollout_parts(adv: list[float] = ADV):
    """Four on-policy AR Parts of the seed-0 tiny Qwen3 (sampled by Hugging Face code)."""
    bundle = CausalLMBundle.tiny_qwen3(seed=0)
    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=6, temperature=1.0, seed=3))
    parts = [s.part("ar") for s in pipe.generate(samples(), rollout_step=0)]
    for p, a in zip(parts, adv):
        p.advantage = a
    return parts


def hf_grads(backend) -> dict[str, torch.Tensor]:
    """The accumulated gradients under the Hugging Face weight names."""
    if hasattr(backend, "_to_hf"):  # megatron: swapped into the parameters and exported
        return backend._to_hf({n: p.grad for n, p in backend.trainable.items()})
    return {
        n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().cpu().clone()
        for n, p in backend.module.named_parameters()  # a tied weight once
    }


def grpo_step(
    backend,
    micro: int = 2,
    shard: slice = slice(None),
    adv: list[float] = ADV,
    grpo: GRPOConfig | None = None,
) -> tuple[dict, dict[str, torch.Tensor]]:
    """One GRPO update (`grpo`, default GRPOConfig()) of `backend` on `rollout_parts(adv)[shard]`:
    its metrics and its gradients."""
    bundle = CausalLMBundle.tiny_qwen3(seed=0)
    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=6, temperature=1.0, seed=3))
    pipe.replay_model = backend.module
    grads: dict[str, torch.Tensor] = {}
    reduce = backend._reduce_grads

    def capture() -> None:  # the reduced gradients the optimizer is about to apply
        reduce()
        grads.update(hf_grads(backend))

    backend._reduce_grads = capture
    stack = TrainStack(backend, (grpo or GRPOConfig()).build(), pipe, BatchGeometry(micro_batch_size=micro))
    metrics = stack.train_on(rollout_parts(adv)[shard])
    del backend._reduce_grads
    return metrics, grads


def assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rel: float = 1e-5) -> None:
    assert set(a) == set(b)
    for n in b:
        err = (a[n] - b[n]).norm() / b[n].norm().clamp(min=1e-12)
        assert err <= rel, f"{n}: relative gradient error {err:.2e}"


def test_grpo_step_matches_fsdp2() -> None:
    from unirl.train.backends.fsdp import FSDPConfig

    fsdp = FSDPConfig(optimizer=AdamWConfig(lr=1e-2)).build(qwen3(), "cpu")
    m_f, g_f = grpo_step(fsdp)
    m_m, g_m = grpo_step(megatron(qwen3()))
    for m in (m_f, m_m):  # on-policy first update: the replay reproduces the rollout log-probs
        assert m["ratio_min"] == pytest.approx(1.0, abs=1e-5) and m["ratio_max"] == pytest.approx(
            1.0, abs=1e-5
        )
    assert m_m["loss"] == pytest.approx(m_f["loss"], abs=1e-6)
    assert m_m["grad_norm"] == pytest.approx(m_f["grad_norm"], rel=1e-5)
    assert_same_grads(g_m, g_f)


def test_micro_batch_split_does_not_change_the_gradient() -> None:
    m1, g1 = grpo_step(megatron(qwen3()), micro=1)
    m4, g4 = grpo_step(megatron(qwen3()), micro=4)
    assert m1["loss"] == pytest.approx(m4["loss"], abs=1e-6)
    assert_same_grads(g1, g4)


def test_sdpa_attention_equals_megatron_core_unfused() -> None:
    m0, g0 = grpo_step(megatron(qwen3(), attention="unfused"))
    backend = megatron(qwen3())  # the default: SDPA
    from unirl.train.backends.megatron.attention import SDPACoreAttention

    assert isinstance(backend.gpt.decoder.layers[0].self_attention.core_attention, SDPACoreAttention)
    m1, g1 = grpo_step(backend)
    assert m1["loss"] == pytest.approx(m0["loss"], abs=1e-7)
    assert_same_grads(g1, g0, rel=1e-5)


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute_gives_the_same_gradient(recompute: str) -> None:
    m0, g0 = grpo_step(megatron(qwen3()))
    backend = megatron(qwen3(), recompute=recompute)
    assert backend.gpt.config.recompute_granularity == recompute
    m1, g1 = grpo_step(backend)
    assert m1["loss"] == pytest.approx(m0["loss"], abs=1e-7)
    assert_same_grads(g1, g0, rel=1e-6)


def test_rollout_copy_follows_the_trained_weights() -> None:
    backend = megatron(qwen3())
    rollout = backend.rollout_module
    grpo_step(backend)
    trained = backend.full_state_dict()

    def checksum(sd: dict[str, torch.Tensor]) -> float:
        return sum(float(v.double().sum()) for v in sd.values())

    assert checksum(rollout.state_dict()) != checksum(trained)  # behind until a sync
    with backend.gathered():
        now = rollout.state_dict()
        assert all(torch.equal(now[n], trained[n]) for n in trained)
        assert checksum(now) == checksum(trained)
        with torch.no_grad():  # the decode copy and the megatron-core model are the same policy
            torch.testing.assert_close(
                rollout(input_ids=TOKENS).logits, backend.module(input_ids=TOKENS).logits, rtol=0, atol=2e-6
            )
    assert rollout.lm_head.weight is rollout.model.embed_tokens.weight  # the tie survives the sync


def test_resume_equals_uninterrupted() -> None:
    cfg = dict(ema=EMAConfig(decay=0.7), reference="frozen_copy")
    straight = megatron(qwen3(), **cfg)
    grpo_step(straight)
    grpo_step(straight)

    first = megatron(qwen3(), **cfg)
    grpo_step(first)
    state = first.state_dict()
    assert set(state["model"]) == set(qwen3().state_dict()) - {"lm_head.weight"}  # HF names, tied once
    resumed = megatron(qwen3(), **cfg)
    resumed.load_state_dict(state)
    assert resumed.global_step == 1
    grpo_step(resumed)
    a, b = straight.state_dict(), resumed.state_dict()
    for key in ("model", "ema", "reference"):
        assert all(torch.equal(a[key][n], b[key][n]) for n in a[key]), key
    for k in ("exp_avg", "exp_avg_sq"):
        assert all(torch.equal(a["optimizer"][k][n], b["optimizer"][k][n]) for n in a["optimizer"][k])
    assert b["global_step"] == 2


# -- tensor parallelism: two gloo ranks ----------------------------------------------------------


def _tp_worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    import conftest as tiny

    backend = megatron(qwen3(), tensor_model_parallel_size=2)
    shard = backend.trainable["gpt.decoder.layers.0.mlp.linear_fc1.weight"].shape
    metrics, grads = grpo_step(backend)
    state = backend.state_dict()  # collective
    from unirl.train import checkpoint as ckpt

    ckpt.save_checkpoint(Path(out_dir) / "ckpt-tp2", backend, extra={"cursor": 4}, format="sharded")
    with pytest.raises(ValueError, match="sequence_parallel=True needs Transformer Engine"):
        megatron(qwen3(), tensor_model_parallel_size=2, sequence_parallel=True)  # no TE on CPU
    from megatron.core import parallel_state as mpu

    mpu.destroy_model_parallel()  # now TP=1: two data-parallel ranks, each on half the batch
    dp_metrics, dp_grads = grpo_step(megatron(qwen3()), shard=slice(2 * rank, 2 * rank + 2))
    if rank == 0:
        out = {
            "metrics": {
                "loss": torch.tensor(metrics["loss"]),
                "grad_norm": torch.tensor(metrics["grad_norm"]),
                "fc1_shard_rows": torch.tensor(shard[0]),
            },
            "grads": grads,
            "state": state,
            "dp_loss": torch.tensor(dp_metrics["loss"]),
            "dp_grads": dp_grads,
        }
        torch.save(out, Path(out_dir) / "tp2.pt")
    tiny.leave_world()


@pytest.mark.slow
def test_tensor_and_data_parallel_two_equal_one(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(
        _tp_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    two = torch.load(tmp_path / "tp2.pt", weights_only=True)
    one = megatron(qwen3())
    m1, g1 = grpo_step(one)
    fc1 = one.trainable["gpt.decoder.layers.0.mlp.linear_fc1.weight"].shape[0]
    assert int(two["metrics"]["fc1_shard_rows"]) * 2 == fc1  # the layer really was split
    assert float(two["metrics"]["loss"]) == pytest.approx(m1["loss"], abs=1e-6)
    assert float(two["metrics"]["grad_norm"]) == pytest.approx(m1["grad_norm"], rel=1e-5)
    assert_same_grads(two["grads"], g1)
    assert float(two["dp_loss"]) == pytest.approx(m1["loss"], abs=1e-6)  # DP=2 sums to the batch's
    assert_same_grads(two["dp_grads"], g1)
    # TP=2 checkpoint state resumes at TP=1: the same weights and moments as the TP=1 run's
    resumed = megatron(qwen3())
    resumed.load_state_dict(two["state"])
    state, ref = resumed.state_dict(), one.state_dict()
    for n, v in ref["model"].items():  # AdamW's first step is ~lr (1e-2) per entry, m / sqrt(v) of
        # a near-zero gradient entry amplifies the TP run's float noise: 0.5% of a step allowed
        torch.testing.assert_close(state["model"][n], v, rtol=0, atol=5e-5)
    for n, v in ref["optimizer"]["exp_avg_sq"].items():
        torch.testing.assert_close(state["optimizer"]["exp_avg_sq"][n], v, rtol=1e-4, atol=1e-12)
    # and the sharded checkpoint (safetensors, written at world 2 / TP=2) resumes at world 1 / TP=1
    from unirl.train import checkpoint as ckpt

    fresh = megatron(qwen3())
    assert ckpt.load_checkpoint(tmp_path / "ckpt-tp2", fresh) == {"cursor": 4}
    again = fresh.state_dict()
    assert fresh.global_step == 1
    for key in ("model",):
        assert all(torch.equal(again[key][n], two["state"][key][n]) for n in two["state"][key])
    for k in ("exp_avg", "exp_avg_sq"):
        assert all(torch.equal(again["optimizer"][k][n], v) for n, v in two["state"]["optimizer"][k].items())


# -- CUDA ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_grpo_step_matches_fsdp2() -> None:
    """On CUDA: fp32 (TF32 off) parity with FSDP2 as on CPU; bf16 compute (the default there)
    within bf16 rounding of it, on-policy, and the rollout copy synced after the step."""
    from unirl.train.backends.fsdp import FSDPConfig
    from unirl.train.precision import PrecisionConfig

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    fp32 = PrecisionConfig(param_dtype="fp32")
    fsdp = FSDPConfig(optimizer=AdamWConfig(lr=1e-2), precision=fp32).build(qwen3(), "cuda")
    m_f, g_f = grpo_step(fsdp)
    m_m, g_m = grpo_step(megatron(qwen3(), "cuda", precision=fp32))
    assert m_m["loss"] == pytest.approx(m_f["loss"], abs=1e-6)
    assert m_m["grad_norm"] == pytest.approx(m_f["grad_norm"], rel=1e-5)
    assert_same_grads(g_m, g_f)
    backend = megatron(qwen3(), "cuda")
    assert backend.module.compute_dtype == torch.bfloat16
    m_b, g_b = grpo_step(backend)
    assert m_b["ratio_max"] == pytest.approx(1.0, abs=0.05) and m_b["ratio_min"] == pytest.approx(
        1.0, abs=0.05
    )
    assert m_b["grad_norm"] == pytest.approx(m_f["grad_norm"], rel=0.05)
    assert_same_grads(g_b, g_f, rel=0.1)
    with backend.gathered():
        trained = backend.full_state_dict()
        now = backend.rollout_module.state_dict()
        assert all(torch.equal(now[n].cpu(), trained[n]) for n in trained)


# -- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("virtual_pipeline_model_parallel_size", 2, "leave it unset"),
        ("context_parallel_size", 2, "use 1"),
        ("expert_model_parallel_size", 4, "use 1"),
        ("distributed_optimizer", True, "use false"),
        ("lora", {"r": 4, "alpha": 8.0, "target_modules": ["q_proj"]}, "kind: fsdp"),
    ],
)
def test_config_refuses_what_it_does_not_run(field: str, value: object, fix: str) -> None:
    with pytest.raises(ValueError, match=f"backend.{field}=") as err:
        MegatronConfig(optimizer=AdamWConfig(lr=1e-3), **{field: value})
    assert fix in str(err.value)


def test_config_errors_name_field_and_fix() -> None:
    with pytest.raises(
        ValueError, match="sequence_parallel=True needs backend.tensor_model_parallel_size > 1"
    ):
        MegatronConfig(optimizer=AdamWConfig(lr=1e-3), sequence_parallel=True)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2 does not divide the world size 1"):
        megatron(qwen3(), tensor_model_parallel_size=2)
    with pytest.raises(ValueError, match="needs a Hugging Face causal LM"):
        megatron(torch.nn.Linear(2, 2))
    with pytest.raises(Exception, match="tensor_model_parallel_sise"):  # a typo is not ignored
        MegatronConfig(optimizer=AdamWConfig(lr=1e-3), tensor_model_parallel_sise=2)


def test_backend_config_picks_the_kind() -> None:
    from pydantic import TypeAdapter

    adapter = TypeAdapter(BackendConfig)
    m = adapter.validate_python({"kind": "megatron", "optimizer": {"lr": 1e-3}, "recompute": "selective"})
    assert isinstance(m, MegatronConfig) and m.recompute == "selective"
    f = adapter.validate_python({"optimizer": {"lr": 1e-3}})  # the default stays FSDP2
    assert type(f).__name__ == "FSDPConfig"
    with pytest.raises(Exception, match="context_parallel_size=3"):
        adapter.validate_python({"kind": "megatron", "optimizer": {"lr": 1e-3}, "context_parallel_size": 3})
