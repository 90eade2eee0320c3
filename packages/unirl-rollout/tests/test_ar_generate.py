"""ARPipeline.generate on a tiny Qwen3: Part filling, seeding, stops, lengths, bad input."""

from __future__ import annotations

import pytest
import torch

from unirl.rollout.ar import ARPipeline, CausalLMBundle
from unirl.types import ARSamplingParams, Part, Sample, TextPrimitive

PROMPTS = ["12+7=", "a much longer prompt, to pad", "9*9=", "x"]


def make_samples(prompts: list[str] = PROMPTS, prefix: str = "s") -> list[Sample]:
    return [
        Sample(id=f"{prefix}{i}", group_id=f"g{i // 2}", inputs=[TextPrimitive(text=t)])
        for i, t in enumerate(prompts)
    ]


@pytest.fixture(scope="module")
def bundle() -> CausalLMBundle:
    torch.set_num_threads(1)
    return CausalLMBundle.tiny_qwen3(seed=0)


def run(bundle: CausalLMBundle, samples: list[Sample], step: int = 0, **params: object) -> list[Part]:
    kw: dict[str, object] = {"max_new_tokens": 12, "temperature": 1.0, **params}
    pipe = ARPipeline(bundle, ARSamplingParams(**kw), sync_every=4)  # type: ignore[arg-type]
    return [s.part("ar") for s in pipe.generate(samples, rollout_step=step)]


def ids(parts: list[Part]) -> list[list[int]]:
    return [p.segment.response_ids for p in parts]  # type: ignore[union-attr]


def test_generate_fills_text_part(bundle: CausalLMBundle) -> None:
    samples = make_samples()
    parts = run(bundle, samples)
    eos = bundle.tokenizer.eos_token_id
    for s, p in zip(samples, parts):
        seg = p.segment
        assert p.name == "ar" and p.parent is None and s.parts == [p]
        assert seg.kind == "text"
        assert seg.prompt_ids == bundle.encode_prompt(s.prompt)
        n = len(seg.response_ids)
        assert 1 <= n <= 12
        assert seg.log_probs.dtype == torch.float32 and seg.log_probs.shape == (n,)
        assert (seg.log_probs <= 0).all() and torch.isfinite(seg.log_probs).all()
        assert seg.loss_mask.dtype == torch.bool and bool(seg.loss_mask.all()) and seg.loss_mask.shape == (n,)
        assert p.sampling_params.stop_token_ids == [eos]  # EOS recorded as a stop token
        assert p.text == bundle.decode(seg.response_ids)
        if seg.finish_reason == "stop":
            assert seg.response_ids[-1] == eos and p.status == "completed"
        else:
            assert n == 12 and eos not in seg.response_ids and p.status == "truncated"


def test_greedy_matches_transformers_generate(bundle: CausalLMBundle) -> None:
    # top_k=1 is greedy: the KV-cached, left-padded loop must match HF generate token for token
    samples = make_samples()
    parts = run(bundle, samples, top_k=1)
    prompts = [p.segment.prompt_ids for p in parts]
    P = max(map(len, prompts))
    inp = torch.tensor([[0] * (P - len(p)) + p for p in prompts])
    att = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    ref = bundle.model.generate(
        input_ids=inp, attention_mask=att, max_new_tokens=12, do_sample=False, pad_token_id=0,
        eos_token_id=bundle.tokenizer.eos_token_id,
    )[:, P:].tolist()  # fmt: skip
    for mine, theirs in zip(ids(parts), ref):
        assert mine == theirs[: len(mine)]
    # and a draw at temperature 1 differs from greedy for at least one prompt
    assert ids(run(bundle, make_samples())) != ids(parts)


def test_seeding_is_per_sample_and_batch_invariant(bundle: CausalLMBundle) -> None:
    base = ids(run(bundle, make_samples(), step=5))
    assert ids(run(bundle, make_samples(), step=5)) == base  # reproducible
    # the same sample alone, or in reversed order, draws the same tokens
    alone = ids(run(bundle, make_samples()[2:3], step=5))
    assert alone == [base[2]]
    rev = ids(run(bundle, make_samples()[::-1], step=5))
    assert rev[::-1] == base
    # a new rollout step, a new seed or a new sample id gives a new draw
    assert ids(run(bundle, make_samples(), step=6)) != base
    assert ids(run(bundle, make_samples(), step=5, seed=1)) != base
    assert ids(run(bundle, make_samples(prefix="t"), step=5)) != base


def test_stop_token_ids_stop_rows_mid_batch(bundle: CausalLMBundle) -> None:
    free = run(bundle, make_samples(), max_new_tokens=16)
    row = free[1].segment.response_ids
    # a token that occurs mid-response (not at position 0) in row 1
    k, stop_tok = next((i, t) for i, t in enumerate(row) if i >= 2)
    stopped = run(bundle, make_samples(), max_new_tokens=16, stop_token_ids=[stop_tok])
    for f, s in zip(free, stopped):
        fr, sr = f.segment.response_ids, s.segment.response_ids
        if stop_tok in fr:  # same uniforms, same model: stops exactly at its first occurrence
            cut = fr.index(stop_tok) + 1
            assert sr == fr[:cut] and s.segment.finish_reason == "stop" and s.status == "completed"
        else:
            assert sr == fr
        assert torch.equal(s.segment.log_probs, f.segment.log_probs[: len(sr)])
    assert stopped[1].segment.finish_reason == "stop" and len(stopped[1].segment.response_ids) <= k + 1


def test_stop_strings_cut_text_and_keep_completing_token(bundle: CausalLMBundle) -> None:
    free = run(bundle, make_samples(), max_new_tokens=16)
    text = free[0].text
    assert len(text) >= 5
    stop = text[3:5]  # a two-character string that occurs in row 0
    parts = run(bundle, make_samples(), max_new_tokens=16, stop=[stop])
    for f, p in zip(free, parts):
        fr = f.segment.response_ids
        if stop in f.text:
            pos = f.text.index(stop)
            assert p.text == f.text[:pos]
            assert p.segment.finish_reason == "stop" and p.status == "completed"
            n = len(p.segment.response_ids)
            assert p.segment.response_ids == fr[:n]
            assert stop in bundle.decode(fr[:n]) and stop not in bundle.decode(fr[: n - 1])
            assert p.segment.log_probs.shape == (n,)
        else:
            assert p.segment.response_ids == fr and p.text == f.text
    assert stop not in parts[0].text and len(parts[0].segment.response_ids) <= 5


def test_context_window_clips_new_tokens() -> None:
    small = CausalLMBundle.tiny_qwen3(max_position_embeddings=24, chat_template=False)
    samples = make_samples(["0123456789" * 2, "1+1="])
    pipe = ARPipeline(small, ARSamplingParams(max_new_tokens=10), stop_at_eos=False)
    parts = [s.part("ar") for s in pipe.generate(samples, rollout_step=0)]
    assert len(parts[0].segment.response_ids) == 4  # 24 - 20 prompt tokens
    assert parts[0].segment.finish_reason == "length" and parts[0].status == "truncated"
    assert len(parts[1].segment.response_ids) == 10


def test_part_params_override_pipeline_default(bundle: CausalLMBundle) -> None:
    samples = make_samples()
    own = ARSamplingParams(max_new_tokens=3, temperature=0.5, stop_token_ids=[])
    samples[1].parts.append(Part(name="ar", sampling_params=own))
    parts = run(bundle, samples, max_new_tokens=12)
    assert len(parts[1].segment.response_ids) <= 3
    assert parts[1].sampling_params.temperature == 0.5
    assert parts[0].sampling_params.temperature == 1.0


def test_generate_keeps_training_mode_and_grad_state(bundle: CausalLMBundle) -> None:
    bundle.model.train()
    parts = run(bundle, make_samples()[:1])
    assert bundle.model.training
    assert not parts[0].segment.log_probs.requires_grad
    bundle.model.eval()


def test_bad_prompts_raise_naming_sample_and_value() -> None:
    small = CausalLMBundle.tiny_qwen3(max_position_embeddings=16, chat_template=False)
    pipe = ARPipeline(small, ARSamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match=r"sample 'e1'.*empty \(''\)"):
        pipe.generate([Sample(id="e1", group_id="g", inputs=[TextPrimitive(text="")])], rollout_step=0)
    with pytest.raises(ValueError, match=r"sample 'long7'.*prompt is 16 tokens.*context window is 16"):
        pipe.generate(
            [Sample(id="long7", group_id="g", inputs=[TextPrimitive(text="x" * 16)])], rollout_step=0
        )
    with pytest.raises(ValueError, match=r"sample 'n0' has no text input"):
        pipe.generate([Sample(id="n0", group_id="g")], rollout_step=0)
    with pytest.raises(ValueError, match="prompt_template='Q: '"):
        ARPipeline(small, ARSamplingParams(max_new_tokens=4), prompt_template="Q: ")
    with pytest.raises(ValueError, match="max_batch_size=0"):
        ARPipeline(small, ARSamplingParams(max_new_tokens=4), max_batch_size=0)


def test_max_batch_size_chunks_give_the_same_draws(bundle: CausalLMBundle) -> None:
    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=8), max_batch_size=1)
    chunked = [s.part("ar").segment.response_ids for s in pipe.generate(make_samples(), rollout_step=2)]
    assert chunked == ids(run(bundle, make_samples(), step=2, max_new_tokens=8))


def test_is_a_pipeline_and_runs_under_trainside_engine(bundle: CausalLMBundle) -> None:
    from unirl.rollout.engines.trainside import TrainsideEngine
    from unirl.rollout.pipelines.base import Pipeline

    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=4))
    assert isinstance(pipe, Pipeline) and pipe.stage == "ar" and pipe.model is bundle.model
    engine = TrainsideEngine(pipe, weight_version=7)
    bundle.model.train()
    out = engine.generate(make_samples()[:2], rollout_step=0)
    assert [s.part("ar").weight_version for s in out] == [7, 7]
    assert bundle.model.training
    bundle.model.eval()
