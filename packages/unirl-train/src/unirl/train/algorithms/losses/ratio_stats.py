"""Diagnostics shared by the ratio-based losses (Flow-GRPO, FlowDPPO, GRPO, GSPO, DRPO)."""

from __future__ import annotations

from torch import Tensor


def approx_kl(log_ratio: Tensor, mask: Tensor | None = None) -> Tensor:
    """``0.5 * mean(dlogp^2)`` over the (masked) elements: the k2 estimate of KL(pi_old || pi).

    ``log_ratio`` is ``new_logprobs - old_logprobs``. Returns a 0-dim tensor (0 when nothing is selected).
    """
    sq = 0.5 * log_ratio.detach().float() ** 2
    return _masked_mean(sq, mask)


def clip_fraction(ratio: Tensor, eps_low: float, eps_high: float, mask: Tensor | None = None) -> Tensor:
    """Fraction of elements whose ratio lies outside ``[1 - eps_low, 1 + eps_high]``.

    This is Flow-GRPO's ``mean(|rho - 1| > eps)`` generalised to asymmetric bounds; it does not
    depend on the sign of the advantage (a clipped-but-harmless element still counts).
    """
    r = ratio.detach()
    outside = ((r < 1.0 - eps_low) | (r > 1.0 + eps_high)).float()
    return _masked_mean(outside, mask)


def ratio_stats(ratio: Tensor, mask: Tensor | None = None) -> dict[str, float]:
    """``ratio_mean``, ``ratio_min``, ``ratio_max`` over the (masked) elements, as floats.

    An empty selection yields ``1.0`` for all three (the neutral ratio), never NaN.
    """
    r = ratio.detach().float()
    if mask is not None:
        r = r[mask.bool()]
    if r.numel() == 0:
        return {"ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}
    return {"ratio_mean": r.mean().item(), "ratio_min": r.min().item(), "ratio_max": r.max().item()}


def _masked_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return x.mean() if x.numel() else x.new_zeros(())
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1.0)
