"""Per-token KL estimators against a reference policy, with ``d = logp - logp_ref``.

- ``k1 = d`` (unbiased, high variance, can be negative);
- ``k2 = d^2 / 2``;
- ``k3 = exp(-d) + d - 1`` (unbiased for KL(pi || pi_ref), >= 0); ``d`` is clamped to [-20, 20]
  before ``exp`` and the value to [-10, 10], as in verl's ``low_var_kl``;
- ``k3+``: the k3 VALUE with the k2 GRADIENT (straight-through: ``k2 - sg(k2) + sg(k3)``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3", "k3+"]
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "k3+")


def kl_estimate(logp: Tensor, logp_ref: Tensor, kind: KLEstimator) -> Tensor:
    """Elementwise KL estimate; gradients flow through ``logp`` only."""
    d = logp - logp_ref.detach()
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d**2
    if kind == "k3":
        return _k3(d)
    if kind == "k3+":
        k2 = 0.5 * d**2
        return k2 - k2.detach() + _k3(d).detach()
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {KL_ESTIMATORS}")


def _k3(d: Tensor) -> Tensor:
    dc = torch.clamp(d, -20.0, 20.0)
    return torch.clamp(torch.exp(-dc) + dc - 1.0, -10.0, 10.0)
