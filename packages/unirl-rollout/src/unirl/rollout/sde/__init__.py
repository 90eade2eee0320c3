"""SDE step kernels with per-step log-probs (Flow-SDE, Dance-SDE, CPS, ODE) and their strategies."""

from unirl.rollout.sde.base import StepResult, gaussian_mean_log_prob
from unirl.rollout.sde.cps import cps_step
from unirl.rollout.sde.flow_sde import dance_sde_step, flow_sde_step, sde_mean_std
from unirl.rollout.sde.ode import ode_step
from unirl.rollout.sde.strategies import (
    STRATEGIES,
    CPSNoVarianceStrategy,
    CPSStrategy,
    DanceSDEStrategy,
    FlowSDEStrategy,
    ODEStrategy,
    SDEStrategy,
    get_strategy,
)

__all__ = [
    "STRATEGIES",
    "CPSNoVarianceStrategy",
    "CPSStrategy",
    "DanceSDEStrategy",
    "FlowSDEStrategy",
    "ODEStrategy",
    "SDEStrategy",
    "StepResult",
    "cps_step",
    "dance_sde_step",
    "flow_sde_step",
    "gaussian_mean_log_prob",
    "get_strategy",
    "ode_step",
    "sde_mean_std",
]
