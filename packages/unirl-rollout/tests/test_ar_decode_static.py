"""The static-shape decoder (the CUDA-graph path's step, run eagerly here) draws exactly what the
dynamic decoder draws: same tokens, same log-probs, same stop handling, for SDPA and eager
attention, with and without top-k / top-p, whatever the prompt-block padding."""

from __future__ import annotations

import pytest
import torch

from unirl.rollout.ar import ARPipeline, CausalLMBundle
from unirl.rollout.ar.decode import decode
from unirl.rollout.ar.decode_static import decode_static
from unirl.types import ARSamplingParams, Sample, TextPrimitive

PROMPTS = [[5, 6, 7, 8, 9], [4, 3], [9, 9, 9, 1, 2, 3, 4], [11]]


@pytest.fixture(scope="module")
def bundle() -> CausalLMBundle:
    return CausalLMBundle.tiny_qwen3(seed=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (5, 0.8)])
@pytest.mark.parametrize("pad_to", [1, 16])
def test_static_decoder_matches_dynamic(bundle, attn: str, top_k: int, top_p: float, pad_to: int) -> None:
    model = bundle.model.eval()
    model.config._attn_implementation = attn
    try:
        u = torch.rand(len(PROMPTS), 14, generator=torch.Generator().manual_seed(3))
        kw = dict(
            uniforms_BN=u, limits=[14, 6, 14, 9], temperature=0.9, top_k=top_k, top_p=top_p,
            stop_token_ids=[], pad_token_id=bundle.pad_token_id, sync_every=4,
        )  # fmt: skip
        kw["stop_token_ids"] = [int(decode(model, PROMPTS, **kw).tokens[0, 3])]  # row 0 stops at step 3
        ref = decode(model, PROMPTS, **kw)
        got = decode_static(model, PROMPTS, pad_prompt_to=pad_to, graph=False, kv_bucket=4, **kw)
    finally:
        model.config._attn_implementation = "sdpa"
    assert torch.equal(got.tokens, ref.tokens)
    assert torch.equal(got.lengths, ref.lengths) and torch.equal(got.stopped, ref.stopped)
    torch.testing.assert_close(got.logprobs, ref.logprobs, atol=1e-5, rtol=0)
    assert bool(ref.stopped[0]) and int(ref.lengths[0]) <= 4 and int(ref.lengths[1]) <= 6


def test_pipeline_decoders_give_identical_samples(bundle) -> None:
    params = ARSamplingParams(max_new_tokens=10, temperature=1.0, seed=4)

    def run(decoder: str) -> list[tuple[list[int], list[float]]]:
        pipe = ARPipeline(bundle, params, decoder=decoder)  # type: ignore[arg-type]
        samples = [
            Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text=t)])
            for i, t in enumerate(["1+1=", "23+19=", "7="])
        ]
        out = pipe.generate(samples, rollout_step=2)
        return [(s.part("ar").segment.response_ids, s.part("ar").segment.log_probs.tolist()) for s in out]

    dyn, sta = run("dynamic"), run("static")
    assert [r for r, _ in dyn] == [r for r, _ in sta]
    for (_, a), (_, b) in zip(dyn, sta):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5


def test_static_decoder_refuses_lockstep_and_sliding_models(bundle) -> None:
    with pytest.raises(ValueError, match="lockstep"):
        ARPipeline(bundle, ARSamplingParams(max_new_tokens=4), decoder="graph", lockstep_group="world")
    cfg = bundle.model.config
    saved = cfg.layer_types
    cfg.layer_types = ["sliding_attention"] * len(saved)
    try:
        with pytest.raises(NotImplementedError, match="full-attention"):
            decode_static(
                bundle.model, [[1, 2]], uniforms_BN=torch.rand(1, 3), limits=[3], temperature=1.0,
                top_k=0, top_p=1.0, stop_token_ids=[], pad_token_id=bundle.pad_token_id,
            )  # fmt: skip
    finally:
        cfg.layer_types = saved


@pytest.mark.slow
@pytest.mark.parametrize("fused", [False, True])
def test_compiled_step_matches_eager_step(bundle, fused: bool) -> None:
    """torch.compile of the whole static step (model, cache writes, sampling, bookkeeping) draws
    the same tokens as the eager step, and a second call with the same shapes does not recompile."""
    torch._dynamo.reset()
    model = bundle.model.eval()
    u = torch.rand(len(PROMPTS), 12, generator=torch.Generator().manual_seed(5))
    kw = dict(
        uniforms_BN=u, limits=[12, 5, 12, 9], temperature=1.0, top_k=0, top_p=1.0,
        stop_token_ids=[], pad_token_id=bundle.pad_token_id, sync_every=4, graph=False, pad_prompt_to=16,
    )  # fmt: skip
    ref = decode_static(model, PROMPTS, **kw)
    got = decode_static(model, PROMPTS, compile=True, fused=fused, **kw)
    assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.lengths, ref.lengths)
    torch.testing.assert_close(got.logprobs, ref.logprobs, atol=1e-4, rtol=0)
    from torch._dynamo.utils import counters

    frames = counters["stats"]["unique_graphs"]
    again = decode_static(model, PROMPTS, compile=True, fused=fused, **{**kw, "uniforms_BN": u.flip(0)})
    assert counters["stats"]["unique_graphs"] == frames, "a second call with the same shapes recompiled"
    assert not torch.equal(again.tokens, got.tokens)


def test_compile_rejects_kv_buckets(bundle) -> None:
    with pytest.raises(ValueError, match="kv_bucket=0 with compile"):
        decode_static(
            bundle.model, PROMPTS, uniforms_BN=torch.rand(4, 3), limits=[3] * 4, temperature=1.0, top_k=0,
            top_p=1.0, stop_token_ids=[], pad_token_id=0, compile=True, kv_bucket=8,
        )  # fmt: skip


FSDP_WORKER = """
import json, os, sys
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from unirl.rollout.ar import CausalLMBundle
from unirl.rollout.ar.decode_static import decode_static

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1)
model = CausalLMBundle.tiny_qwen3(seed=0).model.eval()
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model)
units = [m for m in model.modules() if hasattr(m, "unshard")]
hooks = lambda: [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in units]
prompts = [[5, 6, 7, 8, 9], [4, 3], [11]]
kw = dict(uniforms_BN=torch.rand(3, 8, generator=torch.Generator().manual_seed(1)), limits=[8, 8, 8],
          temperature=1.0, top_k=0, top_p=1.0, stop_token_ids=[], pad_token_id=0, graph=False)
out = {"before": hooks()}
try:
    decode_static(model, prompts, compile=True, **kw)
except RuntimeError as e:
    out["sharded_error"] = str(e)
for m in units:  # what FSDPBackend.gathered() does
    m.set_reshard_after_forward(False, recurse=False)
    m.unshard()
ref = decode_static(model, prompts, **kw)
got = decode_static(model, prompts, compile=True, **kw)
out.update(after=hooks(), same=torch.equal(ref.tokens, got.tokens),
           dlogp=float((ref.logprobs - got.logprobs).abs().max()))
json.dump(out, open(sys.argv[1], "w"))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_compiled_step_on_gathered_fsdp_model(tmp_path) -> None:
    """On an FSDP2 model inside gathered weights, the compiled step detaches FSDP's forward hooks
    (one whole-model graph), matches the eager step and restores the hooks; sharded weights are
    refused with a message naming the fix."""
    import json
    import subprocess
    import sys

    from unirl.distributed.collective import free_port

    script = tmp_path / "worker.py"
    script.write_text(FSDP_WORKER)
    res = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, str(script), str(res), str(free_port())], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(res.read_text())
    assert "backend.gathered()" in out["sharded_error"]
    assert out["before"] == out["after"] and all(pre >= 1 and post >= 1 for pre, post in out["before"])
    assert out["same"] and out["dlogp"] < 1e-4


@pytest.mark.parametrize("flex", [False, True])
@pytest.mark.parametrize("attn_bias", [False, True])
def test_fused_step_matches_model_step(attn_bias: bool, flex: bool, monkeypatch) -> None:
    """The fused forward (concatenated projections, direct cache writes) samples what the model's
    own forward samples: same tokens, log-probs within fp32 rounding, for Qwen3 (q/k norms) and a
    Qwen2-style model with attention biases, with its SDPA attention (CPU) and with the flex
    attention formulation CUDA runs (its block mask over the filled cache blocks; eager here)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import unirl.rollout.ar.fused_decode as fused_decode

    monkeypatch.setattr(fused_decode, "FLEX_OFF_CUDA", flex)
    monkeypatch.setattr(fused_decode, "KV_BLOCK", 8)  # the 16 prompt + 10 new slots span 4 blocks

    if attn_bias:
        torch.manual_seed(0)
        cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
        model = Qwen2ForCausalLM(cfg).eval()
    else:
        model = CausalLMBundle.tiny_qwen3(seed=0).model.eval()
    u = torch.rand(len(PROMPTS), 10, generator=torch.Generator().manual_seed(2))
    kw = dict(
        uniforms_BN=u, limits=[10, 4, 10, 7], temperature=0.8, top_k=0, top_p=1.0,
        stop_token_ids=[], pad_token_id=0, graph=False, pad_prompt_to=16,
    )  # fmt: skip
    ref = decode_static(model, PROMPTS, **kw)
    got = decode_static(model, PROMPTS, fused=True, **kw)
    assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.lengths, ref.lengths)
    torch.testing.assert_close(got.logprobs, ref.logprobs, atol=1e-5, rtol=0)


def test_fused_refuses_what_it_cannot_represent() -> None:
    """Adapters (any projection that is not a plain ``nn.Linear``, as peft's LoRA layers are not)
    and non-SiLU MLPs are refused with the reason, never approximated; a peft-wrapped model is
    unwrapped first (``get_base_model``)."""
    from torch import nn

    from unirl.rollout.ar.fused_decode import FusedLM, fusable

    class Adapted(nn.Linear):  # stands for an adapter layer: computes more than its weight
        pass

    model = CausalLMBundle.tiny_qwen3(seed=0).model
    assert fusable(model) is None

    class Wrapper(nn.Module):  # peft's model wrapper exposes the base model like this
        def __init__(self, base: nn.Module) -> None:
            super().__init__()
            self.base = base

        def get_base_model(self) -> nn.Module:
            return self.base

    assert fusable(Wrapper(model)) is None
    q = model.model.layers[1].self_attn.q_proj
    model.model.layers[1].self_attn.q_proj = Adapted(q.in_features, q.out_features, bias=False)
    assert "layer 1 projections are ['Adapted', 'Linear'], not plain nn.Linear" in str(fusable(model))
    with pytest.raises(ValueError, match="use fused=False"):
        FusedLM.of(Wrapper(model))
    model.model.layers[1].self_attn.q_proj = q
    model.config.hidden_act = "gelu"
    assert "hidden_act='gelu'" in str(fusable(model))
