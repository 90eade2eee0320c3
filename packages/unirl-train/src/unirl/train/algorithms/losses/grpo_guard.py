"""GRPO-Guard ratio normalisation for diffusion log-ratios.

For two Gaussians with the same std ``s`` and a stored sample ``x``:
``dlogp = mean[(mu - mu_old)(x - mu_old)] / s^2 - mean[(mu - mu_old)^2] / (2 s^2)``.
The second term is always <= 0, so diffusion ratios are biased below 1. GRPO-Guard rescales by
``s`` and adds the bias back before clipping:
``guarded = s * dlogp + mean[(mu - mu_old)^2] / (2 s) = mean[(mu - mu_old)(x - mu_old)] / s``.
Only this ratio normalisation is implemented (not the paper's per-step gradient reweighting).
"""

from __future__ import annotations

from torch import Tensor


def guarded_log_ratio(log_ratio: Tensor, mean: Tensor, mean_old: Tensor, std: Tensor) -> Tensor:
    """Return ``s * dlogp + mean_elements((mu - mu_old)^2) / (2 s)`` per sample: ``[B]``.

    ``log_ratio``: ``[B]`` (``new_logprobs - old_logprobs``, mean-over-elements convention); ``mean``,
    ``mean_old``: ``[B, ...]``; ``std``: ``[B]``. Gradients flow through ``log_ratio`` and ``mean``.
    """
    diff = mean.float() - mean_old.float().detach()
    s_b = std.float().reshape(-1).expand(diff.shape[0])
    bias = (diff**2).flatten(1).mean(dim=1) / (2.0 * s_b)
    return s_b * log_ratio.float() + bias
