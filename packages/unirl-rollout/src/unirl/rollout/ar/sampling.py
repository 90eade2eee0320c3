"""Token sampling math: temperature, top-k / top-p filtering, inverse-CDF draws, log-probs, seeds.

Log-prob convention (pinned by tests/test_ar_sampling.py): the log-prob recorded for a sampled
token is ``log_softmax(logits / temperature)[token]`` — the temperature-scaled, *unfiltered*
distribution. Top-k / top-p only decide which tokens may be drawn; they do not renormalise the
recorded log-prob. One function computes it, ``token_logprobs``: sampling records it for the
drawn token, replay (teacher forcing) recomputes it for the stored token from the logits alone,
so the first-update ratio is 1 (bitwise where the logits are; the diffusion side likewise has
one SDE kernel for rollout and replay). The price: when top-k / top-p cut mass, the recorded
value is the log-prob under the policy's tempered distribution, not under the truncated sampler
(the same choice as verl / OpenRLHF with vLLM's processed log-probs off).

All functions are pure and work on ``[B, V]`` batches without host syncs.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor


def derive_seed(seed: int, rollout_step: int, sample_id: str) -> int:
    """A stable 63-bit seed from ``(seed, rollout_step, sample_id)``.

    Uses SHA-256 of the joined string, so it does not depend on Python's hash randomisation,
    on the batch a sample lands in, or on the process that samples it.
    """
    digest = hashlib.sha256(f"{seed}\x1f{rollout_step}\x1f{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def draw_uniforms(seeds: list[int], num_steps: int, device: torch.device | str = "cpu") -> Tensor:
    """``[B, num_steps]`` fp32 uniforms in [0, 1), row ``b`` from a CPU generator seeded ``seeds[b]``.

    Drawn on CPU so the stream does not depend on the accelerator, then moved once to ``device``.
    Row ``b`` is a prefix-stable stream: drawing more steps never changes the earlier ones.
    """
    rows = []
    for s in seeds:
        g = torch.Generator(device="cpu")
        g.manual_seed(s)
        rows.append(torch.rand(num_steps, generator=g, dtype=torch.float32))
    if not rows:
        return torch.empty(0, num_steps, dtype=torch.float32, device=device)
    return torch.stack(rows).to(device)


def token_logprobs(logits_BV: Tensor, temperature: float | Tensor, ids_B: Tensor) -> Tensor:
    """The log-prob of ``ids`` under ``log_softmax(logits / temperature)``, fp32, written as
    ``z[id] - logsumexp(z)`` with ``z = logits / temperature``.

    The one per-token log-prob of AR: sampling records it for the drawn token (``[B, V]`` logits,
    ``[B]`` ids, ``temperature`` a float or ``[B, 1]``), replay recomputes it teacher-forced
    (``[B, T, V]`` logits, ``[B, T]`` ids, ``[B, 1, 1]`` temperatures), so both sides round alike.
    It never holds the fp32 distribution over the vocabulary for backward (on CUDA, replay runs
    it compiled: one fused pass over the logits each way). The whole distribution, which drawing
    (top-k / top-p) and the entropy need, is ``tempered_logprobs``.
    """
    z = logits_BV.float() / temperature
    return z.gather(-1, ids_B.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def tempered_logprobs(logits_BV: Tensor, temperature: float | Tensor) -> Tensor:
    """``log_softmax(logits / temperature)`` over the vocabulary, fp32; ``temperature`` is a float
    or ``[B, 1]``. The distribution the sampler draws from and whose entropy replay reports; the
    log-prob of one token, recorded or replayed, is ``token_logprobs`` (the two formulas round
    differently, up to ~1e-5 absolute at V=32000, so a token's log-prob never comes from here).
    """
    return torch.log_softmax(logits_BV.float() / temperature, dim=-1)


def filter_logits(logits_BV: Tensor, *, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set logits outside the top-k, then outside the top-p nucleus, to ``-inf``.

    Order as in Hugging Face: top-k first, then top-p over the renormalised survivors. Top-p keeps
    the smallest prefix of tokens (by descending probability) whose mass reaches ``top_p``; the
    most likely token is always kept. Ties at the cut are broken by ``torch.sort`` order.
    ``top_k <= 0`` and ``top_p >= 1`` disable the respective filter.
    """
    V = logits_BV.shape[-1]
    use_k = 0 < top_k < V
    use_p = top_p < 1.0
    if not (use_k or use_p):
        return logits_BV
    sorted_BV, order_BV = torch.sort(logits_BV, dim=-1, descending=True)
    remove_BV = torch.zeros_like(sorted_BV, dtype=torch.bool)
    if use_k:
        remove_BV[:, top_k:] = True
        sorted_BV = sorted_BV.masked_fill(remove_BV, float("-inf"))
    if use_p:
        probs_BV = torch.softmax(sorted_BV, dim=-1)
        mass_before_BV = torch.cumsum(probs_BV, dim=-1) - probs_BV
        remove_BV = remove_BV | (mass_before_BV >= top_p)
        remove_BV[:, 0] = False
    remove_orig_BV = torch.zeros_like(remove_BV).scatter(-1, order_BV, remove_BV)
    return logits_BV.masked_fill(remove_orig_BV, float("-inf"))


_CDF_BLOCK = 1024  # vocabularies larger than this are searched block first, then within the block


@torch.compiler.disable  # inductor (torch 2.11, CUDA) fails to generate this cumsum + searchsorted
def inverse_cdf_sample(probs_BV: Tensor, u_B: Tensor) -> Tensor:
    """Token ids ``[B]``: the first index whose cumulative probability exceeds ``u * total``.

    A token with zero probability is never returned. One uniform per row makes the draw a pure
    function of (probs, u). Above ``_CDF_BLOCK`` tokens the search is two-level: the cumulative
    sums of blocks of ``_CDF_BLOCK`` tokens pick the block, then the cumulative sum within it
    picks the token. Same distribution as one flat cumulative sum (which, over a 150k vocabulary
    at batch 64, is a single slow scan kernel), and still never a zero-probability token.
    """
    probs_BV = probs_BV.float()
    B, V = probs_BV.shape
    if V <= _CDF_BLOCK:
        cdf_BV = torch.cumsum(probs_BV, dim=-1)
        return _search(cdf_BV, u_B.float().unsqueeze(-1) * cdf_BV[:, -1:])
    n_blocks = -(-V // _CDF_BLOCK)
    blocks_BNK = torch.nn.functional.pad(probs_BV, (0, n_blocks * _CDF_BLOCK - V)).view(
        B, n_blocks, _CDF_BLOCK
    )
    block_sums_BN = blocks_BNK.sum(-1)
    block_cdf_BN = torch.cumsum(block_sums_BN, dim=-1)
    x_B1 = u_B.float().unsqueeze(-1) * block_cdf_BN[:, -1:]
    blk_B = _search(block_cdf_BN, x_B1)  # a block with positive mass
    inner_BK = blocks_BNK.gather(1, blk_B[:, None, None].expand(B, 1, _CDF_BLOCK)).squeeze(1)
    before_B1 = (block_cdf_BN - block_sums_BN).gather(1, blk_B[:, None])
    tok_B = _search(torch.cumsum(inner_BK, dim=-1), (x_B1 - before_B1).clamp(min=0.0))
    return (blk_B * _CDF_BLOCK + tok_B).clamp_(max=V - 1)


def _search(cdf_BV: Tensor, x_B1: Tensor) -> Tensor:
    """The first index whose ``cdf`` exceeds ``x`` (kept strictly below the last value, which
    ``u * total`` can round up to), so the chosen entry has positive mass."""
    total_B1 = cdf_BV[:, -1:]
    x_B1 = torch.minimum(x_B1, torch.nextafter(total_B1, torch.zeros_like(total_B1)))
    return torch.searchsorted(cdf_BV, x_B1, right=True).squeeze(-1).clamp_(max=cdf_BV.shape[-1] - 1)


def sample_next_token(
    logits_BV: Tensor, u_B: Tensor, *, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Draw one token per row and return ``(tokens [B] int64, logp [B] fp32)``.

    ``logp`` follows the module's convention: the tempered, unfiltered log-prob of the token
    (``token_logprobs``, the function replay uses).
    """
    logp_BV = tempered_logprobs(logits_BV, temperature)
    probs_BV = torch.softmax(filter_logits(logp_BV, top_k=top_k, top_p=top_p), dim=-1)
    tokens_B = inverse_cdf_sample(probs_BV, u_B)
    return tokens_B, token_logprobs(logits_BV, temperature, tokens_B)
