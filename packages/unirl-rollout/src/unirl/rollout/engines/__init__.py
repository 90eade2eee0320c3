"""Rollout engines. ``trainside`` is built in; dedicated engines (sglang, vllm) live behind extras.

The HTTP engines (``sglang_llm``, ``sglang``, ``vllm_omni``) need only httpx (imported lazily);
``composed`` chains any of them; ``guards`` holds the sigma-echo and log-prob-parity checks.
"""

from unirl.rollout.engines.base import ClosableEngine, DedicatedRolloutEngine, EngineMetrics, RolloutEngine
from unirl.rollout.engines.composed import ComposedEngine, ComposedEngineConfig
from unirl.rollout.engines.guards import (
    LogProbParityError,
    SigmaEchoError,
    check_sigma_echo,
    logprob_parity,
    weight_stamp,
)
from unirl.rollout.engines.sglang_diffusion import SGLangDiffusionEngine, SGLangDiffusionEngineConfig
from unirl.rollout.engines.sglang_llm import SGLangLLMEngine, SGLangLLMEngineConfig
from unirl.rollout.engines.trainside import TrainsideEngine
from unirl.rollout.engines.vllm_omni import VLLMOmniEngine, VLLMOmniEngineConfig

__all__ = [
    "ClosableEngine",
    "ComposedEngine",
    "ComposedEngineConfig",
    "DedicatedRolloutEngine",
    "EngineMetrics",
    "LogProbParityError",
    "RolloutEngine",
    "SGLangDiffusionEngine",
    "SGLangDiffusionEngineConfig",
    "SGLangLLMEngine",
    "SGLangLLMEngineConfig",
    "SigmaEchoError",
    "TrainsideEngine",
    "VLLMOmniEngine",
    "VLLMOmniEngineConfig",
    "check_sigma_echo",
    "logprob_parity",
    "weight_stamp",
]
