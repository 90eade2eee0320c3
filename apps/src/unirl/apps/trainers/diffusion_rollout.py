"""`rollout.engine` of a diffusion recipe: who samples, built in one place (``build_engine``).

- ``trainside`` (default): the training module itself samples (``TrainsideEngine``), no weight sync.
- ``sglang`` / ``vllm_omni``: an HTTP diffusion server samples (``unirl.rollout.engines``): the
  driver pins sigmas, noise, SDE strategy and SDE indices; the engine checks the sigma echo, the
  SDE-index echo and the trajectory shape at the boundary. Here the reply also gets the conditions
  replay needs (the server returns none: the trainer's frozen encoders re-encode the prompts) and a
  log-prob parity guard: every SDE step the server scored is replayed with the trainer's weights
  and ``|engine - replay| <= rollout.parity_bound`` is required (``LogProbParityError`` otherwise).

No weight route into a diffusion server exists yet: the server keeps the weights it started with,
so the parity guard is what stops a run once the trainer's policy has moved away from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from unirl.rollout.engines import (
    RolloutEngine,
    SGLangDiffusionEngineConfig,
    TrainsideEngine,
    VLLMOmniEngineConfig,
    logprob_parity,
)
from unirl.rollout.engines.remote_diffusion import RemoteDiffusionEngine
from unirl.rollout.pipelines import FlowMatchPipeline, pin_sigmas
from unirl.types import DiffusionSamplingParams, LatentTrajectory, Part, Sample, to_torch
from unirl.types.base import kind_or

__all__ = [
    "DiffusionRolloutConfig",
    "RemoteDiffusionRollout",
    "TrainsideDiffusionEngineConfig",
    "build_engine",
]

REMOTE_KINDS = ("sglang", "vllm_omni")


class TrainsideDiffusionEngineConfig(BaseModel):
    """Sample with the training module itself (no weight sync)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["trainside"] = "trainside"


DiffusionEngineConfig = Annotated[
    Annotated[TrainsideDiffusionEngineConfig, Tag("trainside")]
    | Annotated[SGLangDiffusionEngineConfig, Tag("sglang")]
    | Annotated[VLLMOmniEngineConfig, Tag("vllm_omni")],
    Discriminator(kind_or("trainside")),
]


class DiffusionRolloutConfig(BaseModel):
    """Who samples the RL rollouts and evaluations: ``engine.kind`` trainside | sglang | vllm_omni."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    engine: DiffusionEngineConfig = Field(default_factory=TrainsideDiffusionEngineConfig)
    parity_bound: float | None = Field(
        default=1e-3,
        gt=0,
        description="remote engines: max |engine - replay| per-SDE-step log-prob (the pipeline's "
        "mean-over-elements log-prob); None: measure only. No effect with kind=trainside",
    )

    @model_validator(mode="before")
    @classmethod
    def _remote_needs_url(cls, data: object) -> object:
        eng = data.get("engine") if isinstance(data, dict) else None
        if isinstance(eng, dict) and eng.get("kind") in REMOTE_KINDS and not eng.get("url"):
            raise ValueError(
                f"rollout.engine.kind={eng['kind']!r} needs rollout.engine.url (the server's base URL), got "
                f"{eng.get('url')!r}: set rollout.engine.url=http://HOST:PORT, or use kind=trainside"
            )
        return data

    @model_validator(mode="after")
    def _recipe_owns_sampling(self) -> DiffusionRolloutConfig:
        """The recipe's ``sampling`` and stage drive every engine; a second copy here would diverge."""
        e = self.engine
        if isinstance(e, TrainsideDiffusionEngineConfig):
            return self
        given = {
            "sampling": (e.sampling, None),
            "stage": (e.stage, "diffusion"),
            "prompt_part": (e.prompt_part, None),
        }
        for name, (value, default) in given.items():
            if value != default:
                raise ValueError(
                    f"rollout.engine.{name}={value!r}: in a recipe the engine samples with the "
                    f"recipe's `sampling` for the 'diffusion' Part; drop rollout.engine.{name}"
                )
        return self


class RemoteDiffusionRollout:
    """An HTTP diffusion engine behind the trainer: conditions for replay, then the parity guard."""

    def __init__(
        self, engine: RemoteDiffusionEngine, pipeline: FlowMatchPipeline, parity_bound: float | None
    ) -> None:
        self.engine, self.pipeline, self.parity_bound = engine, pipeline, parity_bound
        self.last_metrics: dict[str, float] = {}

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        out = self.engine.generate(samples, rollout_step=rollout_step)
        parts = [s.part(self.engine.stage) for s in out]
        by_params: dict[str, list[int]] = {}
        for i, p in enumerate(parts):
            by_params.setdefault(p.sampling_params.model_dump_json(), []).append(i)  # type: ignore[union-attr]  # set by the engine
        for idx in by_params.values():
            params = parts[idx[0]].sampling_params
            assert isinstance(params, DiffusionSamplingParams)  # the engine set it (checked there)
            for i, c in zip(idx, self.pipeline.encode_conditions([out[i] for i in idx], params)):
                parts[i].conditions = c
        self.last_metrics = dict(self.engine.last_metrics) | self._parity(out, parts)
        return out

    @torch.no_grad()
    def _parity(self, samples: Sequence[Sample], parts: Sequence[Part]) -> dict[str, float]:
        """Replay every scored SDE step with the trainer's weights; compare with the engine's."""
        scored = [(s, p) for s, p in zip(samples, parts) if _segment(p).log_probs is not None]
        if not scored:
            return {}
        engine_lp, replay_lp, ids = [], [], []
        groups: dict[tuple[int, ...], list[tuple[Sample, Part]]] = {}
        for s, p in scored:
            groups.setdefault(tuple(_segment(p).sde_indices), []).append((s, p))
        for sde, members in groups.items():
            batch = [p for _, p in members]
            rows = torch.stack(
                [_replay(self.pipeline, batch, j) for j in sde], dim=1
            )  # [B, K] replayed log-probs of the K SDE steps
            for (s, p), row in zip(members, rows):
                engine_lp.append(to_torch(_segment(p).log_probs).float().reshape(-1))
                replay_lp.append(row.float().cpu())
                ids.append(s.id)
        return logprob_parity(engine_lp, replay_lp, max_abs_bound=self.parity_bound, sample_ids=ids)

    def metrics(self) -> dict[str, float]:
        """The last rollout's guard metrics (sigma echo deviation, log-prob parity)."""
        return dict(self.last_metrics)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def close(self) -> None:
        self.engine.close()


def _segment(part: Part) -> LatentTrajectory:
    seg = part.segment
    if not isinstance(seg, LatentTrajectory):
        raise TypeError(f"part {part.name!r}: a diffusion engine filled a {type(seg).__name__}")
    return seg


def _replay(pipeline: FlowMatchPipeline, parts: list[Part], step: int) -> torch.Tensor:
    lp = pipeline.replay_step(parts, step).log_prob
    if lp is None:
        raise ValueError(f"step {step} replays deterministically (eta=0) but the engine scored it")
    return lp


def build_engine(
    cfg: DiffusionRolloutConfig, pipeline: FlowMatchPipeline, weight_version: Callable[[], int]
) -> RolloutEngine:
    """The recipe's rollout engine over ``pipeline`` (the trainer's: it samples trainside, and it
    re-encodes prompts and replays for a remote engine's parity guard)."""
    e = cfg.engine
    if isinstance(e, TrainsideDiffusionEngineConfig):
        return TrainsideEngine(pipeline, weight_version=weight_version)
    remote = e.build(pin=lambda p: pin_sigmas(p, pipeline.bundle))
    remote.default_params = pipeline.default_params
    return RemoteDiffusionRollout(remote, pipeline, cfg.parity_bound)
