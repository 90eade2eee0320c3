"""Token cross-entropy SFT: the per-token loss is ``-logp_t`` of the target token."""

from __future__ import annotations

from torch import Tensor


def token_nll(logp: Tensor) -> Tensor:
    """Per-token negative log-likelihood ``[B, T]``; reduce with ``aggregation.aggregate``."""
    return -logp
