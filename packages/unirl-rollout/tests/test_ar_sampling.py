"""Pure sampling math: seeds, uniforms, top-k / top-p, inverse-CDF draws, log-prob convention, stops."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from unirl.rollout.ar.sampling import (
    derive_seed,
    draw_uniforms,
    filter_logits,
    inverse_cdf_sample,
    sample_next_token,
    tempered_logprobs,
    token_logprobs,
)
from unirl.rollout.ar.stopping import cut_at_stop_string, first_stop


def test_derive_seed_is_stable_and_distinct() -> None:
    # SHA-256 based: a fixed value across processes and Python versions (no hash randomisation).
    assert derive_seed(0, 0, "a") == derive_seed(0, 0, "a")
    digest = hashlib.sha256(b"0\x1f0\x1fa").digest()
    assert derive_seed(0, 0, "a") == int.from_bytes(digest[:8], "little") & (2**63 - 1) == 1648193374633973114
    seeds = {derive_seed(s, k, i) for s in (0, 1) for k in (0, 1) for i in ("a", "b")}
    assert len(seeds) == 8
    assert all(0 <= x < 2**63 for x in seeds)
    # the separator keeps (1, 23) and (12, 3) apart
    assert derive_seed(1, 23, "x") != derive_seed(12, 3, "x")


def test_draw_uniforms_rows_are_independent_prefix_stable_streams() -> None:
    u = draw_uniforms([7, 8], 5)
    assert u.shape == (2, 5) and u.dtype == torch.float32
    assert ((u >= 0) & (u < 1)).all()
    # drawing more steps never changes the earlier ones; a row does not depend on its neighbours
    assert torch.equal(draw_uniforms([7], 9)[0, :5], u[0])
    assert torch.equal(draw_uniforms([8, 7], 5)[1], u[0])
    g = torch.Generator().manual_seed(7)
    assert torch.equal(u[0], torch.rand(5, generator=g))


def test_tempered_logprobs_worked_numbers() -> None:
    # logits [0, ln 3], T = 1: p = [1/4, 3/4]; T = 2: logits/2 = [0, ln sqrt3] -> p = [1/(1+sqrt3), sqrt3/(1+sqrt3)]
    logits = torch.tensor([[0.0, math.log(3.0)]])
    assert torch.allclose(tempered_logprobs(logits, 1.0).exp(), torch.tensor([[0.25, 0.75]]))
    s3 = math.sqrt(3.0)
    assert torch.allclose(tempered_logprobs(logits, 2.0).exp(), torch.tensor([[1 / (1 + s3), s3 / (1 + s3)]]))


def _kept(logits: torch.Tensor, **kw: float) -> list[int]:
    out = filter_logits(logits, **kw)  # type: ignore[arg-type]
    return sorted(torch.isfinite(out[0]).nonzero().flatten().tolist())


def test_top_k_top_p_filters_worked_examples() -> None:
    # probs by token id: 0:0.15  1:0.5  2:0.05  3:0.3 (unsorted on purpose: the mask is scattered back)
    logits = torch.tensor([[0.15, 0.5, 0.05, 0.3]]).log()
    assert _kept(logits) == [0, 1, 2, 3]
    assert _kept(logits, top_k=2) == [1, 3]
    assert _kept(logits, top_k=1) == [1]
    # descending 0.5, 0.3, 0.15, 0.05; mass before each = 0, 0.5, 0.8, 0.95; drop where >= top_p
    assert _kept(logits, top_p=0.7) == [1, 3]
    assert _kept(logits, top_p=0.85) == [0, 1, 3]
    assert _kept(logits, top_p=0.4) == [1]  # the top token is always kept
    # top-k first, then top-p over the renormalised survivors [0.625, 0.375]: mass before 0, 0.625
    assert _kept(logits, top_k=2, top_p=0.6) == [1]
    assert _kept(logits, top_k=2, top_p=0.7) == [1, 3]
    # kept logits are unchanged
    out = filter_logits(logits, top_k=2)
    assert torch.equal(out[0, [1, 3]], logits[0, [1, 3]])


def test_inverse_cdf_sample_worked_numbers() -> None:
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).expand(6, 4)
    # cdf = 0.1, 0.3, 0.6, 1.0: pick the first index whose cdf exceeds u
    u = torch.tensor([0.0, 0.05, 0.15, 0.45, 0.65, 0.999999])
    assert inverse_cdf_sample(probs, u).tolist() == [0, 0, 1, 2, 3, 3]
    # a zero-probability token is never drawn, even with u on its cdf value
    z = torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert inverse_cdf_sample(z, torch.tensor([0.5, 0.0, 0.99999994])).tolist() == [2, 2, 0]
    # unnormalised rows behave like their normalised version
    assert inverse_cdf_sample(torch.tensor([[2.0, 6.0]]), torch.tensor([0.3])).tolist() == [1]


def test_sample_frequencies_match_filtered_distribution() -> None:
    # a stratified grid of u reproduces the filtered, renormalised probabilities exactly
    logits = torch.tensor([[0.15, 0.5, 0.05, 0.3]]).log()
    M = 2000
    u = (torch.arange(M, dtype=torch.float32) + 0.5) / M
    tok, _ = sample_next_token(logits.expand(M, 4), u, temperature=1.0, top_k=2)
    freq = torch.bincount(tok, minlength=4).float() / M
    assert torch.allclose(freq, torch.tensor([0.0, 0.625, 0.0, 0.375]), atol=1e-3)


def test_logprob_is_tempered_unfiltered() -> None:
    # with top_k=1 the drawn token is the argmax, but its recorded log-prob is log softmax(logits/T)
    # over the FULL vocabulary: log(0.5) at T = 1, not 0 (the renormalised top-k value).
    logits = torch.tensor([[0.15, 0.5, 0.05, 0.3]]).log()
    tok, lp = sample_next_token(logits, torch.tensor([0.9]), temperature=1.0, top_k=1)
    assert tok.tolist() == [1]
    assert torch.allclose(lp, torch.tensor([math.log(0.5)]))
    # T = 0.5 squares and renormalises: 0.25 / (0.0225 + 0.25 + 0.0025 + 0.09)
    tok, lp = sample_next_token(logits, torch.tensor([0.9]), temperature=0.5, top_p=0.5)
    assert tok.tolist() == [1]
    assert torch.allclose(lp, torch.tensor([math.log(0.25 / 0.365)]))


def test_recorded_logprob_is_the_replay_function_bitwise() -> None:
    """Sampling records ``token_logprobs`` of the drawn token, so replaying the same logits
    teacher-forced (``[B, T, V]``, one temperature per row) gives the recorded values exactly."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 3, 300, generator=g)  # [B, T, V]
    temps = torch.tensor([1.0, 0.7, 1.3, 0.9])
    recorded = []
    for t in range(3):
        rows = [
            sample_next_token(
                logits[b : b + 1, t], torch.rand(1, generator=g), temperature=float(temps[b]), top_k=50
            )
            for b in range(4)
        ]
        recorded.append((torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])))
    ids_BT = torch.stack([r[0] for r in recorded], dim=1)
    replayed = token_logprobs(logits, temps.view(-1, 1, 1), ids_BT)
    assert torch.equal(replayed, torch.stack([r[1] for r in recorded], dim=1))


def test_first_stop_and_cut() -> None:
    assert first_stop("abc END x STOP", ["STOP", "END"]) == 4
    assert first_stop("abc", ["x", ""]) is None

    def decode(ids: object) -> str:
        return "".join(chr(i) for i in ids)  # type: ignore[attr-defined]

    ids = [ord(c) for c in "12=3\n\nmore"]
    # the stop string "\n\n" is completed by token 5 (0-based); keep 6 tokens, cut the text before it
    assert cut_at_stop_string(ids, decode, ["\n\n"]) == (6, "12=3")
    assert cut_at_stop_string(ids, decode, ["zz"]) is None
    assert cut_at_stop_string(ids, decode, ["=", "more"]) == (3, "12")
    assert cut_at_stop_string(ids, decode, []) is None


@pytest.mark.parametrize("V", [3, 50])
def test_filter_noop_cases(V: int) -> None:
    logits = torch.randn(2, V)
    assert filter_logits(logits, top_k=0, top_p=1.0) is logits
    assert filter_logits(logits, top_k=V, top_p=1.0) is logits


def test_two_level_search_draws_the_flat_cdf_tokens(monkeypatch) -> None:
    """Above the block size the search is block-then-token; it picks the flat inverse-CDF token
    (here on a sparse 5000-token distribution with mass on block edges) and never a zero."""
    import unirl.rollout.ar.sampling as sampling

    V = 5000
    probs = torch.zeros(V)
    support = torch.tensor([3, 1023, 1024, 1500, 2047, 2048, 4999])
    probs[support] = torch.tensor([0.1, 0.05, 0.2, 0.05, 0.15, 0.2, 0.25])
    u = torch.cat(
        [torch.rand(4000, generator=torch.Generator().manual_seed(0)), torch.tensor([0.0, 1 - 2**-24])]
    )
    two_level = sampling.inverse_cdf_sample(probs.expand(len(u), V), u)
    monkeypatch.setattr(sampling, "_CDF_BLOCK", 10**9)
    flat = sampling.inverse_cdf_sample(probs.expand(len(u), V), u)
    assert torch.equal(two_level, flat)
    assert bool((probs[two_level] > 0).all())
    freq = torch.bincount(two_level, minlength=V)[support].float() / len(u)
    torch.testing.assert_close(freq, probs[support], atol=0.025, rtol=0)


def test_token_logprobs_match_the_tempered_distribution_with_gradients() -> None:
    """``token_logprobs`` (``z[id] - logsumexp(z)``, compiled in replay on CUDA) equals
    ``tempered_logprobs`` gathered at the ids, in value and in gradient, with a per-row
    temperature; also through torch.compile."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, 40, generator=g, dtype=torch.float64).to(torch.bfloat16)
    temp = torch.tensor([1.0, 0.7, 1.3]).view(-1, 1, 1)
    ids = torch.randint(0, 40, (3, 5), generator=g)
    weight = torch.randn(3, 5, generator=g)
    grads = []
    for fn in (
        lambda x: tempered_logprobs(x, temp).gather(-1, ids[..., None]).squeeze(-1),
        lambda x: token_logprobs(x, temp, ids),
        lambda x: torch.compile(token_logprobs)(x, temp, ids),
    ):
        x = logits.clone().requires_grad_(True)
        out = fn(x)
        (out * weight).sum().backward()
        grads.append((out.detach(), x.grad.float()))
    for out, grad in grads[1:]:
        torch.testing.assert_close(out, grads[0][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(grad, grads[0][1], atol=1e-2, rtol=0)  # bf16 gradient of a bf16 leaf
    assert grads[0][0].dtype == torch.float32 and bool((grads[0][0] < 0).all())
