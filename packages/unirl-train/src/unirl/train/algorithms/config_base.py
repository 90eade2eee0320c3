"""The base of every algorithm config: strict, frozen pydantic, and the capabilities the apps ask of it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class AlgorithmConfigBase(BaseModel):
    """Strict (``extra="forbid"``: a typo is an error naming the field) and frozen.

    The apps wire an algorithm from these typed capabilities instead of probing for fields:
    ``kl_weight`` / ``needs_reference`` (a KL or drift term against a reference policy) and
    ``sampling_overrides()`` (sampling params the rollout must use). The defaults say "none";
    a config with such a term or requirement overrides them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    @property
    def kl_weight(self) -> float:
        """Weight of the loss's KL / drift term against a reference policy (its ``kl_coef``);
        0.0 for an algorithm without one."""
        return 0.0

    @property
    def needs_reference(self) -> bool:
        """The loss has a KL / drift term (``kl_weight`` != 0): wire a reference policy
        (``algorithm.set_reference``; recipe: ``backend.reference``)."""
        return self.kl_weight != 0.0

    def sampling_overrides(self) -> dict[str, Any]:
        """Sampling-param fields the rollout must use for this algorithm (e.g. DanceGRPO's SDE
        strategy); empty when it trains on whatever the configured sampler draws."""
        return {}
