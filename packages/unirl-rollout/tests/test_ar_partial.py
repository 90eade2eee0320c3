"""Partial rollouts: a generation interrupted at token k and continued after a weight swap.

Same weights: the tokens and log-probs of the uninterrupted generation. Other weights: the tokens
before k are the old policy's (its teacher-forced replay gives their log-probs), those after k the
new one's, and the spans of versions say which is which."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from unirl.rollout.ar import ARPipeline, CausalLMBundle, PartialRollouts, behavior_logprobs
from unirl.types import ARSamplingParams, Part, Sample, TextPrimitive, TextSegment

PROMPTS = ["1+2=", "a longer prompt with more tokens", "33*3=", "?", "5-9=", "hello"]
N = 20


class QueuedWeights:
    """A ``WeightSwap`` over a queue of published state dicts: each ``swap`` loads the next one
    into the model (what the async rollout copy does with its mailbox)."""

    def __init__(self, model: nn.Module, published: list[dict[str, torch.Tensor]]) -> None:
        self.model, self.queue = model, list(published)
        self.version = 0
        self.asked = 0

    def held(self) -> tuple[int, int]:
        return self.version, 10 * self.version

    def newer(self) -> bool:
        self.asked += 1
        return bool(self.queue)

    def swap(self) -> None:
        self.model.load_state_dict(self.queue.pop(0))
        self.version += 1


@pytest.fixture(scope="module")
def bundle() -> CausalLMBundle:
    torch.set_num_threads(1)
    return CausalLMBundle.tiny_qwen3(seed=2)


def generate(bundle: CausalLMBundle, partial: PartialRollouts | None = None) -> list[TextSegment]:
    params = ARSamplingParams(max_new_tokens=N, temperature=0.7, top_k=8, top_p=0.9, seed=5)
    pipe = ARPipeline(bundle, params, sync_every=3)
    pipe.enable_partial(partial)
    samples = [
        Sample(id=f"r{i}", group_id="g", inputs=[TextPrimitive(text=t)]) for i, t in enumerate(PROMPTS)
    ]
    out = [s.part("ar").segment for s in pipe.generate(samples, rollout_step=1)]
    assert all(isinstance(s, TextSegment) for s in out)
    return out  # type: ignore[return-value]


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def perturbed(model: nn.Module, scale: float = 0.3) -> dict[str, torch.Tensor]:
    """The model's weights with seeded noise of ``scale`` times each parameter's spread added."""
    g = torch.Generator().manual_seed(7)
    sd = state(model)
    for k, p in model.named_parameters():
        sd[k] = sd[k] + scale * p.detach().std().nan_to_num() * torch.randn(p.shape, generator=g).to(p.device)
    return sd


def test_continued_with_the_same_weights_is_the_uninterrupted_generation(bundle: CausalLMBundle) -> None:
    w0 = state(bundle.model)
    plain = generate(bundle)
    assert max(len(s.response_ids) for s in plain) > 9, "the free run must outlast three chunks"
    # three publications of the same weights: interrupted at tokens 3, 6 and 9
    swap = QueuedWeights(bundle.model, [w0, w0, w0])
    cont = generate(bundle, PartialRollouts(swap, chunk_tokens=3))
    assert swap.version == 3 and not swap.queue
    for a, b in zip(plain, cont):
        assert b.response_ids == a.response_ids and b.finish_reason == a.finish_reason
        # a re-prefill of prompt + prefix vs the KV cache: the same fp32 numbers up to round-off
        torch.testing.assert_close(b.log_probs, a.log_probs, atol=1e-6, rtol=0)
        n = len(a.response_ids)
        expected = [(st, v, 10 * v) for v, st in enumerate(range(0, min(n, 12), 3))]
        assert [(s.start, s.version, s.weight_version) for s in b.versions or []] == expected, n
        assert b.token_versions() == [min(t // 3, 3) for t in range(n)]


def test_continued_with_new_weights_scores_each_token_under_its_own_policy(bundle: CausalLMBundle) -> None:
    check_new_weights_parity(bundle, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_continued_with_new_weights_parity_on_cuda() -> None:
    """The same parity on a GPU, fp32 (the decode's KV-cached kernels vs one replay forward)."""
    bundle = CausalLMBundle.tiny_qwen3(seed=2)
    bundle.model.to("cuda")
    check_new_weights_parity(bundle, atol=1e-4)


def check_new_weights_parity(bundle: CausalLMBundle, *, atol: float) -> None:
    k = 4
    w0, w1 = state(bundle.model), perturbed(bundle.model)
    old = generate(bundle)
    swap = QueuedWeights(bundle.model, [w1])
    try:
        mixed = generate(bundle, PartialRollouts(swap, chunk_tokens=k))
        assert swap.version == 1
        # tokens before k: drawn by the old policy from the same uniforms
        for a, b in zip(old, mixed):
            assert b.response_ids[:k] == a.response_ids[:k]
        assert any(b.response_ids[k:] != a.response_ids[k:] for a, b in zip(old, mixed)), "swap had no effect"
        parts = [Part(name="ar", segment=s, sampling_params=ARSamplingParams(max_new_tokens=N, temperature=0.7))
                 for s in mixed]  # fmt: skip
        behav = behavior_logprobs(parts)
        pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=N, temperature=0.7))
        with torch.no_grad():
            new = pipe.replay_logprobs(parts)  # the new weights are loaded
            bundle.model.load_state_dict(w0)
            was = pipe.replay_logprobs(parts)
        after, before = new.mask.clone(), new.mask.clone()
        after[:, :k], before[:, k:] = False, False
        assert after.any() and before.any()
        behav = behav.to(new.logp.device)
        torch.testing.assert_close(behav[after], new.logp[after], atol=atol, rtol=0)
        torch.testing.assert_close(behav[before], was.logp[before], atol=atol, rtol=0)
        # the two policies really differ on these tokens: the spans are not decoration
        assert (was.logp[after] - new.logp[after]).abs().max() > 1e-2
        for s in mixed:
            n = len(s.response_ids)
            assert s.token_versions() == [int(t >= k) for t in range(n)]
    finally:
        bundle.model.load_state_dict(w0)


def test_partial_needs_the_dynamic_decoder(bundle: CausalLMBundle) -> None:
    pipe = ARPipeline(bundle, ARSamplingParams(max_new_tokens=4), decoder="static")
    with pytest.raises(ValueError, match="partial rollouts need decoder='dynamic'"):
        pipe.enable_partial(PartialRollouts(QueuedWeights(bundle.model, []), chunk_tokens=2))
