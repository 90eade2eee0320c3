"""Teacher-forced replay of stored responses: per-token log-probs with gradients.

Layout of one micro-batch (``P`` = longest prompt, ``T`` = longest response)::

    [pad pad p p p | r r r pad]      prompts left-padded, responses right-padded
    positions: 0-based over real tokens only (cumsum of the attention mask), as at sampling

All responses start at column ``P``, so the logits that predict them are the ``T`` columns
``P-1 .. P+T-2``; the forward computes only those (``logits_to_keep=T+1``, last one dropped).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from unirl.rollout.ar.sampling import tempered_logprobs, token_logprobs


@dataclass
class TokenReplay:
    """Replayed log-probs of a micro-batch of text Parts.

    ``logp[b, t]`` is the log-prob of response token ``t`` of part ``b`` under the current
    weights (temperature-scaled, unfiltered; see ``unirl.rollout.ar.sampling``), with gradients;
    ``mask[b, t]`` is True where the token exists and its loss mask is set. Padded entries of
    ``logp`` are 0. ``entropy`` (when requested) is the tempered distribution's entropy per token.
    """

    logp: Tensor  # [B, T] fp32
    mask: Tensor  # [B, T] bool
    entropy: Tensor | None = None  # [B, T] fp32


def pack_for_replay(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_token_id: int,
    device: torch.device,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(input_ids [B, P+T], attention_mask, position_ids, response_ids [B, T])``, padded as above."""
    B = len(prompts)
    P = max(len(p) for p in prompts)
    T = max(len(r) for r in responses)
    ids = torch.full((B, P + T), pad_token_id, dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        ids[b, P - len(p) : P] = torch.tensor(list(p), dtype=torch.long)
        ids[b, P : P + len(r)] = torch.tensor(list(r), dtype=torch.long)
        attn[b, P - len(p) : P + len(r)] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), attn.to(device), pos.to(device), ids[:, P:].to(device)


def replay_token_logprobs(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    temperatures: Sequence[float],
    *,
    pad_token_id: int,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``(logp [B, T], entropy [B, T] or None)``, fp32, for each response token given its context.

    ``logp`` is the log-prob of the stored token under ``log_softmax(logits / temperature)``, by
    the function sampling records it with (``sampling.token_logprobs``); ``entropy`` (when asked)
    is that tempered distribution's entropy. Runs under the caller's
    grad mode (with gradients during training). Entries past a response's end are 0.
    """
    if not prompts or len(prompts) != len(responses) or len(temperatures) != len(prompts):
        raise ValueError(
            f"need equally many prompts, responses and temperatures (> 0); got "
            f"{len(prompts)}, {len(responses)}, {len(temperatures)}"
        )
    device = next(model.parameters()).device
    T = max(len(r) for r in responses)
    if T == 0:
        empty = torch.zeros((len(prompts), 0), dtype=torch.float32, device=device)
        return empty, (empty.clone() if with_entropy else None)
    ids, attn, pos, resp_BT = pack_for_replay(prompts, responses, pad_token_id, device)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, logits_to_keep=T + 1)
    temp_B11 = torch.tensor(list(temperatures), dtype=torch.float32, device=device).view(-1, 1, 1)
    lengths_B = torch.tensor([len(r) for r in responses], device=device)
    pad_BT = torch.arange(T, device=device)[None, :] >= lengths_B[:, None]
    logits_BTV = out.logits[:, :-1]
    fn = _token_logprobs_compiled() if logits_BTV.is_cuda else token_logprobs
    logp_BT = fn(logits_BTV, temp_B11, resp_BT).masked_fill(pad_BT, 0.0)
    if not with_entropy:
        return logp_BT, None
    return logp_BT, tempered_entropy(logits_BTV, temp_B11).masked_fill(pad_BT, 0.0)


def tempered_entropy(logits_BTV: Tensor, temp_B11: Tensor) -> Tensor:
    """``[B, T]`` fp32 entropy of ``log_softmax(logits / temperature)`` (for logging or a bonus)."""
    logp_BTV = tempered_logprobs(logits_BTV, temp_B11)
    return -(logp_BTV.exp() * logp_BTV).sum(-1)


@functools.cache
def _token_logprobs_compiled() -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    return torch.compile(token_logprobs)  # type: ignore[return-value]
