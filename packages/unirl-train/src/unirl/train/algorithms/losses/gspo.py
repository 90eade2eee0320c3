"""GSPO: one importance ratio per sequence, the geometric mean of the token ratios.

``s_i = exp(clamp(mean_t m (new_logprobs - old_logprobs), -20, 20))`` (mean over the sequence's masked
tokens); ``l_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))``. The aggregation is
seq-mean-token-mean; as every token of a sequence shares ``s_i``, that is ``sum_i l_i / N_seq``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from unirl.train.algorithms.losses.flow_grpo import clipped_surrogate
from unirl.train.algorithms.losses.ppo import LOG_RATIO_CLAMP


def sequence_log_ratio(new_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Masked mean over tokens of ``new_logprobs - old_logprobs`` per sequence: ``[B, T] -> [B]`` (0 for empty rows)."""
    m = mask.to(new_logprobs.dtype)
    d = (new_logprobs - old_logprobs.detach()) * m
    return d.sum(dim=-1) / m.sum(dim=-1).clamp_min(1.0)


def gspo_sequence_loss(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    advantage: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
) -> tuple[Tensor, Tensor]:
    """Per-sequence GSPO loss ``[B]`` and the sequence ratio ``[B]``; divide the sum by global N_seq."""
    log_s = torch.clamp(
        sequence_log_ratio(new_logprobs, old_logprobs, mask), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
    )
    s = torch.exp(log_s)
    return clipped_surrogate(s, advantage.detach().to(s.dtype), eps_low, eps_high), s
