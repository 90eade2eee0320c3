"""MegatronBackend with pipeline parallelism on CPU: two gloo ranks, each one pipeline stage of
the tiny Qwen3 (2 layers: one per stage; the tied embedding / output weight on both stages).

- PP=2 equals PP=1 on the same GRPO step (advantages with a non-zero sum, so the loss is not
  float noise around 0): loss 1e-6, grad norm and every Hugging Face-named gradient 1e-5
  relative, and the weights after the AdamW step; 1, 2 and 4 micro-batches give the same
  gradient through megatron-core's 1F1B schedule (it must not rescale the already-normalised
  loss by the micro-batch count);
- HF -> PP=2 -> HF is bit-exact on every rank, and a no-grad forward (the pipelined
  forward-only pass) gives the Hugging Face logits on every rank, so old log-probs recomputed
  in prepare() are the PP=1 ones; the rollout copy follows;
- resume at PP=2 equals uninterrupted (bit-exact), and PP=2 checkpoint state (in memory, and a
  sharded checkpoint written at world size 2) loads at PP=1;
- virtual pipeline stages (PP=2 x VPP=2 on a 4-layer model, interleaved 1F1B) equal PP=1;
- four ranks: TP=2 x PP=2 and PP=2 x DP=2 equal one rank;
- bad layouts fail naming the fields, the values and the fix.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")
pytest.importorskip("mbridge")

from unirl.rollout.ar.bundle import CausalLMBundle
from unirl.train.algorithms import GRPOConfig
from unirl.train.optim import AdamWConfig

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import test_backend_megatron as tm  # noqa: E402

from unirl.train.backends.megatron import MegatronConfig  # noqa: E402

ADV = [1.0, -0.25, 0.5, 0.75]  # a non-zero sum: the on-policy loss is -mean(A) = -0.5, not 0


def qwen3_4layers() -> torch.nn.Module:
    return CausalLMBundle.tiny_qwen3(seed=0, num_layers=4).model


def _layout_errors() -> None:
    with pytest.raises(ValueError, match=r"pipeline_model_parallel_size=2 = 2 stages do not divide .*=3"):
        tm.megatron(CausalLMBundle.tiny_qwen3(seed=0, num_layers=3).model, pipeline_model_parallel_size=2)
    with pytest.raises(
        ValueError, match=r"pipeline_model_parallel_size=2 = 4 does not divide the world size 2"
    ):
        tm.megatron(tm.qwen3(), pipeline_model_parallel_size=2, tensor_model_parallel_size=2)
    with pytest.raises(ValueError, match=r"already initialised with \(TP, PP, VPP\)=\(1, 2, None\)"):
        tm.megatron(tm.qwen3(), pipeline_model_parallel_size=1)


def _pp_worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    import conftest as tiny

    out: dict = {}
    backend = tm.megatron(tm.qwen3(), pipeline_model_parallel_size=2)
    out["names"] = sorted(backend.trainable)
    out["roundtrip"] = backend.full_state_dict()
    out["streamed"] = sorted(dict(backend.named_hf_weights()))
    with torch.no_grad():
        out["logits"] = backend.module(input_ids=tm.TOKENS).logits
        out["logits_keep"] = backend.module(input_ids=tm.TOKENS, logits_to_keep=3).logits
    with pytest.raises(RuntimeError, match="under torch.no_grad"):
        backend.module(input_ids=tm.TOKENS)
    out["metrics"], out["grads"] = tm.grpo_step(backend, adv=ADV)
    out["updated"] = backend.full_state_dict()
    with backend.gathered():
        rollout = backend.rollout_module.state_dict()
        out["rollout_synced"] = all(torch.equal(rollout[n], v) for n, v in out["updated"].items())
    recompute = GRPOConfig(old_logprobs="recompute")  # pi_old from a forward-only pipeline pass
    out["recompute"] = tm.grpo_step(tm.megatron(tm.qwen3(), pipeline_model_parallel_size=2), adv=ADV, grpo=recompute)  # fmt: skip
    for micro in (1, 4):
        out[f"grads{micro}"] = tm.grpo_step(tm.megatron(tm.qwen3(), pipeline_model_parallel_size=2), micro, adv=ADV)[1]  # fmt: skip
    # resume == uninterrupted at PP=2
    straight = tm.megatron(tm.qwen3(), pipeline_model_parallel_size=2, ema=tm.EMAConfig(decay=0.7))
    tm.grpo_step(straight, adv=ADV)
    tm.grpo_step(straight, adv=ADV)
    first = tm.megatron(tm.qwen3(), pipeline_model_parallel_size=2, ema=tm.EMAConfig(decay=0.7))
    tm.grpo_step(first, adv=ADV)
    out["state1"] = first.state_dict()
    from unirl.train import checkpoint as ckpt

    ckpt.save_checkpoint(Path(out_dir) / "ckpt-pp2", first, extra={"cursor": 4}, format="sharded")
    resumed = tm.megatron(tm.qwen3(), pipeline_model_parallel_size=2, ema=tm.EMAConfig(decay=0.7))
    resumed.load_state_dict(out["state1"])
    tm.grpo_step(resumed, adv=ADV)
    out["straight"], out["resumed"] = straight.state_dict(), resumed.state_dict()
    _layout_errors()
    from megatron.core import parallel_state as mpu

    mpu.destroy_model_parallel()  # PP=2 x VPP=2 on four layers: rank r holds layers r and r + 2
    vpp = tm.megatron(qwen3_4layers(), pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    out["vpp_layers"] = [[layer.layer_number for layer in c.decoder.layers] for c in vpp.chunks]
    out["vpp_metrics"], out["vpp_grads"] = tm.grpo_step(vpp, micro=1, adv=ADV)
    with pytest.raises(ValueError, match="needs a multiple of pipeline_model_parallel_size=2 micro-batches"):
        tm.grpo_step(vpp, micro=4, adv=ADV)  # one micro-batch: the interleaved schedule needs >= 2
    torch.save(out, Path(out_dir) / f"pp2-rank{rank}.pt")
    tiny.leave_world()


def _run_pp2(tmp_path: Path) -> list[dict]:
    import torch.multiprocessing as mp

    mp.start_processes(
        _pp_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    return [torch.load(tmp_path / f"pp2-rank{r}.pt", weights_only=False) for r in range(2)]


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert set(a) == set(b)
    for n in b:
        torch.testing.assert_close(a[n], b[n], rtol=0, atol=atol, msg=n)


@pytest.mark.slow
def test_pipeline_parallel_two_stages_equal_one(tmp_path: Path) -> None:
    ranks = _run_pp2(tmp_path)
    one = tm.megatron(tm.qwen3())
    m1, g1 = tm.grpo_step(one, adv=ADV)
    assert m1["loss"] == pytest.approx(-0.5, abs=1e-5)  # on-policy: ratio 1, -sum(A * n_tokens) / N
    fresh = tm.qwen3().state_dict()
    with torch.no_grad():
        hf_logits = tm.qwen3()(input_ids=tm.TOKENS).logits
    # the stages really are split: rank 0 embeds and runs layer 0, rank 1 runs layer 1 + head
    assert "gpt.embedding.word_embeddings.weight" in ranks[0]["names"]
    assert "gpt.output_layer.weight" in ranks[1]["names"]  # the tied weight's last-stage copy
    assert all(len([n for n in r["names"] if n.endswith("linear_fc2.weight")]) == 1 for r in ranks)
    for r in ranks:  # every rank: the same metrics, the full model, the HF forward
        assert set(r["roundtrip"]) == set(fresh)
        assert all(torch.equal(r["roundtrip"][n], fresh[n]) for n in fresh)
        assert r["streamed"] == sorted(set(fresh) - {"lm_head.weight"})  # a tied weight once
        torch.testing.assert_close(r["logits"], hf_logits, rtol=0, atol=2e-6)
        torch.testing.assert_close(r["logits_keep"], hf_logits[:, -3:], rtol=0, atol=2e-6)
        assert r["metrics"]["loss"] == pytest.approx(m1["loss"], abs=1e-6)
        assert r["metrics"]["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
        assert r["metrics"]["ratio_max"] == pytest.approx(1.0, abs=1e-5)
        tm.assert_same_grads(r["grads"], g1)
        for micro in (1, 4):  # the schedule does not rescale by the micro-batch count
            tm.assert_same_grads(r[f"grads{micro}"], g1)
        assert r["rollout_synced"]
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    m_re, g_re = tm.grpo_step(tm.megatron(tm.qwen3()), adv=ADV, grpo=GRPOConfig(old_logprobs="recompute"))
    for r in ranks:  # old log-probs recomputed in prepare(): the same at PP=2 as at PP=1
        assert r["recompute"][0]["loss"] == pytest.approx(m_re["loss"], abs=1e-6)
        assert r["recompute"][0]["ratio_max"] == pytest.approx(1.0, abs=1e-5)
        tm.assert_same_grads(r["recompute"][1], g_re)
    # the same AdamW step: every updated weight within 1e-5 relative (norm of the difference)
    tm.assert_same_grads(ranks[0]["updated"], one.full_state_dict(), rel=1e-5)
    # resume at PP=2 == uninterrupted, bit-exact; the step counts keyed by global layer names
    a, b = ranks[0]["straight"], ranks[0]["resumed"]
    for key in ("model", "ema"):
        assert all(torch.equal(a[key][n], b[key][n]) for n in a[key]), key
    for k in ("exp_avg", "exp_avg_sq"):
        assert all(torch.equal(a["optimizer"][k][n], b["optimizer"][k][n]) for n in a["optimizer"][k])
    assert set(a["optimizer"]["step"]) == set(one.state_dict()["optimizer"]["step"])
    assert b["global_step"] == 2
    # PP=2 checkpoint state loads at PP=1 and continues as the PP=1 run does
    resumed = tm.megatron(tm.qwen3(), ema=tm.EMAConfig(decay=0.7))
    resumed.load_state_dict(ranks[0]["state1"])
    assert resumed.global_step == 1
    _same_weights(resumed.full_state_dict(), ranks[0]["state1"]["model"] | {"lm_head.weight": ranks[0]["state1"]["model"]["model.embed_tokens.weight"]}, atol=0)  # fmt: skip
    # and the sharded checkpoint (safetensors, written at PP=2 / world 2) resumes at world 1
    from unirl.train import checkpoint as ckpt

    fresh = tm.megatron(tm.qwen3(), ema=tm.EMAConfig(decay=0.7))
    assert ckpt.load_checkpoint(tmp_path / "ckpt-pp2", fresh) == {"cursor": 4}
    again = fresh.state_dict()
    assert fresh.global_step == 1
    for key in ("model", "ema"):
        assert all(torch.equal(again[key][n], v) for n, v in ranks[0]["state1"][key].items()), key
    for k in ("exp_avg", "exp_avg_sq"):
        assert all(
            torch.equal(again["optimizer"][k][n], v) for n, v in ranks[0]["state1"]["optimizer"][k].items()
        )
    # virtual pipeline stages: the interleaved schedule equals one rank with every layer
    assert ranks[0]["vpp_layers"] == [[1], [3]] and ranks[1]["vpp_layers"] == [[2], [4]]
    m4, g4 = tm.grpo_step(tm.megatron(qwen3_4layers()), micro=1, adv=ADV)
    for r in ranks:
        assert r["vpp_metrics"]["loss"] == pytest.approx(m4["loss"], abs=1e-6)
        assert r["vpp_metrics"]["grad_norm"] == pytest.approx(m4["grad_norm"], rel=1e-5)
        tm.assert_same_grads(r["vpp_grads"], g4)


def test_pipeline_layout_errors_name_the_fields() -> None:
    with pytest.raises(
        ValueError, match=r"pipeline_model_parallel_size=2 = 2 does not divide the world size 1"
    ):
        tm.megatron(tm.qwen3(), pipeline_model_parallel_size=2)
    with pytest.raises(ValueError, match="virtual_pipeline_model_parallel_size=2 needs backend.pipeline_model_parallel_size > 1"):  # fmt: skip
        MegatronConfig(optimizer=AdamWConfig(lr=1e-3), virtual_pipeline_model_parallel_size=2)
    with pytest.raises(ValueError, match="greater than or equal to 2"):  # one chunk per rank is no VPP
        MegatronConfig(optimizer=AdamWConfig(lr=1e-3), pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=1)  # fmt: skip
    cfg = MegatronConfig(optimizer=AdamWConfig(lr=1e-3), pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2)  # fmt: skip
    assert cfg.pipeline_model_parallel_size == 4


# -- four ranks: pipeline with tensor and with data parallelism ---------------------------------


def _four_rank_worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    import conftest as tiny
    from megatron.core import parallel_state as mpu

    both = tm.megatron(tm.qwen3(), tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    out = {"tp_pp_weights": both.full_state_dict()}
    out["tp_pp_metrics"], out["tp_pp_grads"] = tm.grpo_step(both, adv=ADV)
    mpu.destroy_model_parallel()  # PP=2 x DP=2: each data-parallel replica trains on half the batch
    dp = tm.megatron(tm.qwen3(), pipeline_model_parallel_size=2)
    half = mpu.get_data_parallel_rank()
    out["pp_dp_metrics"], out["pp_dp_grads"] = tm.grpo_step(dp, shard=slice(2 * half, 2 * half + 2), adv=ADV)
    torch.save(out, Path(out_dir) / f"four-rank{rank}.pt")
    tiny.leave_world()


@pytest.mark.slow
def test_pipeline_with_tensor_and_data_parallel_equal_one(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(
        _four_rank_worker, args=(4, str(tmp_path / "store"), str(tmp_path)), nprocs=4, start_method="spawn"
    )
    m1, g1 = tm.grpo_step(tm.megatron(tm.qwen3()), adv=ADV)
    fresh = tm.qwen3().state_dict()
    for r in range(4):
        out = torch.load(tmp_path / f"four-rank{r}.pt", weights_only=False)
        assert all(torch.equal(out["tp_pp_weights"][n], fresh[n]) for n in fresh)  # TP-gathered, PP-collected
        for key in ("tp_pp", "pp_dp"):
            assert out[f"{key}_metrics"]["loss"] == pytest.approx(m1["loss"], abs=1e-6), key
            assert out[f"{key}_metrics"]["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5), key
            tm.assert_same_grads(out[f"{key}_grads"], g1)
