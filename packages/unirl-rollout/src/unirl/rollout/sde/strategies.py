"""SDE strategies: the step kernels behind one interface, selected by the name in
``DiffusionSamplingParams.sde_strategy`` ("flow_sde" | "dance_sde" | "cps" | "cps_novar" | "ode").

A strategy steps a batch at denoising index ``j`` of a pinned schedule ``sigmas`` [B, T+1]
(fp32), so rollout and replay call literally the same code with the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from torch import Tensor

from unirl.rollout.sde.base import StepResult
from unirl.rollout.sde.cps import CPSScoring, cps_step
from unirl.rollout.sde.flow_sde import dance_sde_step, flow_sde_step
from unirl.rollout.sde.ode import ode_step

__all__ = [
    "STRATEGIES",
    "CPSNoVarianceStrategy",
    "CPSStrategy",
    "DanceSDEStrategy",
    "FlowSDEStrategy",
    "ODEStrategy",
    "SDEStrategy",
    "get_strategy",
]


@runtime_checkable
class SDEStrategy(Protocol):
    """A stochastic step kernel with a per-step score of the sampled transition."""

    @property
    def name(self) -> str:
        """The ``sde_strategy`` value that selects this strategy."""
        ...

    @property
    def stochastic(self) -> bool:
        """False: every step is the Euler step and nothing has a log-prob."""
        ...

    def step(
        self,
        x: Tensor,
        v: Tensor,
        sigmas: Tensor,
        j: int,
        eta: float,
        *,
        noise: Tensor | None = None,
        x_next: Tensor | None = None,
    ) -> StepResult:
        """Step x [B, ...] with velocity v from sigmas[:, j] to sigmas[:, j+1] (sigmas [B, T+1] fp32)."""
        ...

    def check(self, sigmas: Sequence[float], sde_indices: Sequence[int], eta: float) -> None:
        """Raise ValueError if this strategy cannot score the given SDE steps of this schedule."""
        ...


def _check_common(name: str, sigmas: Sequence[float], sde_indices: Sequence[int], eta: float) -> None:
    num_steps = len(sigmas) - 1
    bad = [j for j in sde_indices if not 0 <= j < num_steps]
    if bad:
        raise ValueError(
            f"sde_indices {bad} are out of range for a schedule of {num_steps} steps "
            f"(len(sigmas)={len(sigmas)}); valid indices are 0..{num_steps - 1}"
        )
    if eta < 0:
        raise ValueError(f"eta must be >= 0 for sde_strategy={name!r}; got {eta}")


@dataclass(frozen=True)
class FlowSDEStrategy:
    """Flow-GRPO's SDE (g = eta sqrt(sigma / (1 - sigma))); eta ~ 0.7."""

    name: ClassVar[str] = "flow_sde"
    stochastic: ClassVar[bool] = True

    def step(
        self,
        x: Tensor,
        v: Tensor,
        sigmas: Tensor,
        j: int,
        eta: float,
        *,
        noise: Tensor | None = None,
        x_next: Tensor | None = None,
    ) -> StepResult:
        return flow_sde_step(
            x, v, sigmas[:, j], sigmas[:, j + 1], eta, sigma_at_one=sigmas[:, 1], noise=noise, x_next=x_next
        )

    def check(self, sigmas: Sequence[float], sde_indices: Sequence[int], eta: float) -> None:
        _check_common(self.name, sigmas, sde_indices, eta)
        if len(sigmas) > 1 and any(sigmas[j] == 1.0 for j in sde_indices) and sigmas[1] >= 1.0:
            raise ValueError(
                f"flow_sde needs sigmas[1] < 1 to replace sigma=1 in 1/(1-sigma); got {sigmas[1]}"
            )


@dataclass(frozen=True)
class DanceSDEStrategy:
    """DanceGRPO's SDE (constant g = eta); eta ~ 0.3."""

    name: ClassVar[str] = "dance_sde"
    stochastic: ClassVar[bool] = True

    def step(
        self,
        x: Tensor,
        v: Tensor,
        sigmas: Tensor,
        j: int,
        eta: float,
        *,
        noise: Tensor | None = None,
        x_next: Tensor | None = None,
    ) -> StepResult:
        return dance_sde_step(x, v, sigmas[:, j], sigmas[:, j + 1], eta, noise=noise, x_next=x_next)

    def check(self, sigmas: Sequence[float], sde_indices: Sequence[int], eta: float) -> None:
        _check_common(self.name, sigmas, sde_indices, eta)


@dataclass(frozen=True)
class CPSStrategy:
    """Coefficient-preserving sampling scored with the true Gaussian log-density."""

    name: ClassVar[str] = "cps"
    stochastic: ClassVar[bool] = True
    scoring: ClassVar[CPSScoring] = "gaussian"

    def step(
        self,
        x: Tensor,
        v: Tensor,
        sigmas: Tensor,
        j: int,
        eta: float,
        *,
        noise: Tensor | None = None,
        x_next: Tensor | None = None,
    ) -> StepResult:
        return cps_step(
            x,
            v,
            sigmas[:, j],
            sigmas[:, j + 1],
            eta,
            scoring=self.scoring,
            noise=noise,
            x_next=x_next,  # type: ignore[arg-type]
        )

    def check(self, sigmas: Sequence[float], sde_indices: Sequence[int], eta: float) -> None:
        _check_common(self.name, sigmas, sde_indices, eta)
        if self.scoring == "gaussian" and eta > 0:
            final = [j for j in sde_indices if sigmas[j + 1] <= 0]
            if final:
                raise ValueError(
                    f"sde_strategy='cps' cannot score steps {final}: they end at sigma=0 where the CPS std "
                    "is 0; drop them from the SDE indices or use sde_strategy='cps_novar'"
                )


@dataclass(frozen=True)
class CPSNoVarianceStrategy(CPSStrategy):
    """CPS scored as -mean((x_next - mu)^2): the peers' variance-free score (not a log-density)."""

    name: ClassVar[str] = "cps_novar"
    scoring: ClassVar[CPSScoring] = "no_variance"


@dataclass(frozen=True)
class ODEStrategy:
    """Deterministic Euler sampling everywhere; no log-probs (for DiffusionNFT, SFT, evaluation)."""

    name: ClassVar[str] = "ode"
    stochastic: ClassVar[bool] = False

    def step(
        self,
        x: Tensor,
        v: Tensor,
        sigmas: Tensor,
        j: int,
        eta: float,
        *,
        noise: Tensor | None = None,
        x_next: Tensor | None = None,
    ) -> StepResult:
        return ode_step(x, v, sigmas[:, j], sigmas[:, j + 1])

    def check(self, sigmas: Sequence[float], sde_indices: Sequence[int], eta: float) -> None:
        num_steps = len(sigmas) - 1
        bad = [j for j in sde_indices if not 0 <= j < num_steps]
        if bad:
            raise ValueError(f"sde_indices {bad} are out of range 0..{num_steps - 1}")


STRATEGIES: dict[str, SDEStrategy] = {
    s.name: s
    for s in (FlowSDEStrategy(), DanceSDEStrategy(), CPSStrategy(), CPSNoVarianceStrategy(), ODEStrategy())
}


def get_strategy(name: str) -> SDEStrategy:
    """The strategy for a ``sde_strategy`` name; a clear ValueError listing the options otherwise."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"sde_strategy={name!r} is unknown; choose one of {sorted(STRATEGIES)}") from None
