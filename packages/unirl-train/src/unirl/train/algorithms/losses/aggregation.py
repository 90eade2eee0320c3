"""Loss aggregation over tokens and sequences with GLOBAL denominators.

Each mode reduces a per-token loss ``[B, T]`` under a 0/1 mask. The denominators are the counts
over the WHOLE mini-batch (all micro-batches, all ranks), passed in by the caller, so summing the
micro-batch results equals the full-batch loss whatever the split:
- ``token-mean``:              ``sum_{i,t} m l / N_tokens``
- ``seq-mean-token-mean``:     ``(1 / N_seq) sum_i (sum_t m l / sum_t m)``   (empty rows add 0)
- ``seq-mean-token-sum``:      ``(1 / N_seq) sum_i sum_t m l``
- ``seq-mean-token-sum-norm``: ``(1 / N_seq) sum_i sum_t m l / H``  (Dr.GRPO; H a constant horizon,
  e.g. ``max_new_tokens``)
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

AggregationMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
AGGREGATION_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: AggregationMode,
    *,
    num_tokens: int,
    num_samples: int,
    horizon: int | None = None,
) -> Tensor:
    """This micro-batch's share of the mini-batch loss under ``mode`` (a 0-dim tensor).

    ``loss``/``mask``: ``[B, T]``; ``num_tokens``: global masked-token count; ``num_samples``: global
    sequence count; ``horizon``: the constant ``H`` of ``seq-mean-token-sum-norm`` (required there).
    """
    if loss.shape != mask.shape:
        raise ValueError(f"loss shape {tuple(loss.shape)} != mask shape {tuple(mask.shape)}")
    m = mask.to(loss.dtype)
    masked = loss * m
    if mode == "token-mean":
        return masked.sum() / max(num_tokens, 1)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(dim=-1) / m.sum(dim=-1).clamp_min(1.0)
        return per_seq.sum() / max(num_samples, 1)
    if mode == "seq-mean-token-sum":
        return masked.sum() / max(num_samples, 1)
    if mode == "seq-mean-token-sum-norm":
        if horizon is None or horizon <= 0:
            raise ValueError(
                f"aggregation 'seq-mean-token-sum-norm' needs a positive horizon (e.g. max_new_tokens), got {horizon}"
            )
        return masked.sum() / (max(num_samples, 1) * horizon)
    raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {AGGREGATION_MODES}")
