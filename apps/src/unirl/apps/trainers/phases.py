"""Recipe sections shared by the domain trainers: SFT and RL phases, evaluation, run settings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from unirl.apps.asynchronous.config import AsyncConfig, LifecycleFields
from unirl.apps.distributed.layout import LayoutConfig
from unirl.train.algorithms import AlgorithmConfig
from unirl.train.backends import TrainBackend
from unirl.train.backends.config import FSDPConfig, MegatronConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.optim import ScheduleConfig, phase_scheduler, set_base_lr
from unirl.types import AdvantageConfig

STRICT = ConfigDict(extra="forbid", frozen=True)


class SFTPlan(Protocol):
    """What the shared lifecycle reads of every recipe's ``sft`` (an ``SFTPhaseBase``, or PE's
    ``PESFT`` over its two stacks)."""

    @property
    def steps(self) -> int: ...

    @property
    def stop(self) -> SFTStopConfig | None: ...


class RLPlan(Protocol):
    """What the shared lifecycle reads of every recipe's ``rl`` (``RLPhase``, PE's and the unified
    trainer's phases, whose ``algorithm`` is None: each stack or track names its own)."""

    @property
    def steps(self) -> int: ...

    @property
    def prompts_per_step(self) -> int: ...

    @property
    def samples_per_prompt(self) -> int: ...

    @property
    def lifecycle(self) -> Literal["sync", "async"]: ...

    @property
    def buffer(self) -> AsyncConfig: ...

    @property
    def algorithm(self) -> AlgorithmConfig | None: ...

    def backend_algorithms(self) -> dict[str, AlgorithmConfig]:
        """field path -> each algorithm trained on the recipe's one ``backend`` (its KL needs that
        backend's reference): ``rl.algorithm``, or the unified trainer's tracks; PE's stacks have
        their own backends (checked by its validator)."""
        ...


class LRPhase(Protocol):
    """A phase with its own learning rate (``apply_phase_lr``; a ``PhaseLR`` also has a schedule)."""

    @property
    def lr(self) -> float | None: ...


class ScheduledBackend(TrainBackend, Protocol):
    """A TrainBackend with an optimizer and an LR schedule (``OptimizedBackend``'s: FSDP2,
    megatron), on which ``apply_phase_lr`` sets a phase's learning rate."""

    scheduler: torch.optim.lr_scheduler.LambdaLR

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...


class SFTStopConfig(BaseModel):
    """End SFT when the policy reaches a level on TRAINING prompts, not at a step count: a phase
    transition (e.g. the shapes world's relation jump) comes at a step that differs by seed and by
    CPU, so a step count leaves SFT in a different state on each machine; a level does not.

    Every ``every`` steps from ``min_steps`` on, ``num_prompts`` training prompts (a fixed subset)
    x ``samples_per_prompt`` are sampled with the evaluation's sampler and scored; SFT stops once
    ``metric`` >= ``at_least`` (else at ``sft.steps``). Each probe is logged as phase ``sft_probe``."""

    model_config = STRICT
    metric: str = Field(
        default="accuracy",
        description="accuracy | reward | pass_at_k | a check's rate such as geneval/relation",
    )
    at_least: float = Field(description="stop when the probe's metric reaches this")
    every: int = Field(default=50, ge=1, description="SFT steps between probes")
    min_steps: int = Field(default=0, ge=0, description="no probe before this step")
    num_prompts: int = Field(default=32, ge=1)
    samples_per_prompt: int = Field(default=2, ge=1)


class PhaseLR(BaseModel):
    """A phase's learning rate and schedule (``apply_phase_lr`` puts them on the optimizer)."""

    model_config = STRICT
    lr: float | None = Field(default=None, gt=0, description="overrides backend.optimizer.lr for this phase")
    scheduler: ScheduleConfig | None = Field(
        default=None,
        description="the LR schedule over this phase's own steps (step 0 = the phase's first), in "
        "place of backend.scheduler for the phase; None keeps backend.scheduler",
    )


class SFTPhaseBase(PhaseLR):
    """Supervised warm-start on the data source's (prompt, target) pairs."""

    model_config = STRICT
    steps: int = Field(ge=0, description="optimizer steps (the most, with `stop`); 0 skips the phase")
    stop: SFTStopConfig | None = Field(default=None, description="end SFT at a level on training prompts")
    batch_size: int = Field(ge=1)
    micro_batch_size: int | None = Field(default=None, ge=1, description="default: batch_size")
    checkpoint_every: int = Field(
        default=0, ge=0, description="SFT steps between checkpoints (0 = at the end of SFT only)"
    )


class DynamicSamplingConfig(BaseModel):
    """DAPO dynamic sampling: drop groups whose rewards are all equal (no signal) and refill."""

    model_config = STRICT
    max_extra_rollouts: int = Field(
        default=2,
        ge=1,
        description="extra rollout rounds per step at most; then zero-signal groups fill the batch",
    )


class RLPhase(PhaseLR, LifecycleFields):
    """RL: rollout -> reward -> advantage -> train, ``steps`` times."""

    model_config = STRICT
    steps: int = Field(ge=0)
    prompts_per_step: int = Field(ge=1)
    samples_per_prompt: int = Field(ge=1, description="group size; advantages are normalised within a group")
    algorithm: AlgorithmConfig
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    geometry: BatchGeometry
    dynamic_sampling: DynamicSamplingConfig | None = None
    reset_optimizer: bool = Field(
        default=False,
        description="start RL with fresh optimizer state instead of the SFT phase's: Adam's second "
        "moments from SFT (gradients often far larger than the policy gradient's) otherwise shrink "
        "RL's steps for hundreds of steps. Applied once, when RL starts at step 0 (not on resume).",
    )

    @model_validator(mode="after")
    def _shard(self) -> RLPhase:
        self.geometry.check_shard(self.prompts_per_step * self.samples_per_prompt)
        return self

    def backend_algorithms(self) -> dict[str, AlgorithmConfig]:
        return {"rl.algorithm": self.algorithm}


class EvalConfig(BaseModel):
    model_config = STRICT
    num_prompts: int = Field(default=32, ge=0, description="held-out prompts per evaluation (0 = off)")
    samples_per_prompt: int = Field(
        default=1,
        ge=1,
        description="samples per held-out prompt (accuracy is over all of them; pass_at_k per prompt)",
    )
    every: int = Field(default=0, ge=0, description="evaluate every N RL steps (0 = only before/after)")
    grid_size: int = Field(default=8, ge=0, description="samples shown in the before/after grids")
    success_threshold: float = Field(default=0.999, description="reward >= this counts as solved")


class RunSettings(BaseModel):
    """Fields every recipe has."""

    model_config = STRICT
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads (None = torch default)")
    manual_gc: bool = Field(
        default=True,
        description="Python's cyclic GC between SFT / RL steps instead of inside them (what exists when a "
        "phase starts is frozen out of it): a collection inside a step walks the whole process "
        "(unirl.train.step_gc); false: CPython's automatic collection",
    )
    checkpoint_every: int = Field(default=0, ge=0, description="RL steps between checkpoints (0 = end only)")
    checkpoint_format: Literal["full", "sharded"] = Field(
        default="full",
        description="full: the whole state gathered on rank 0 (one state.pt; resume needs the same "
        "number of train ranks); sharded: each train rank writes its own shards (safetensors + JSON, "
        "no pickle, no full gather; resumable with another number of train ranks)",
    )
    eval: EvalConfig = Field(default_factory=EvalConfig)
    max_restarts: int = Field(
        default=0,
        ge=0,
        description="when a component fails (a Ray worker dies, hangs or raises, a weight sync fails "
        "verification, the reward server stays unavailable), restart the run from its last checkpoint "
        "in this process up to this many times (0: stop with the error, exit code 3)",
    )
    layout: LayoutConfig = Field(
        default_factory=LayoutConfig, description="process layout: one process (single) or Ray workers (ray)"
    )

    if TYPE_CHECKING:  # every recipe declares these (PE's `sft` is a property over its two stacks)
        trainer: str

        @property
        def sft(self) -> SFTPlan | None: ...

        @property
        def rl(self) -> RLPlan | None: ...

    def backend_config(self) -> FSDPConfig | MegatronConfig | None:
        """The recipe's ``backend`` section; None for a recipe with one per stack (PE: ``ar.backend``
        and ``diffusion.backend``, checked by its own validator)."""
        return None

    @model_validator(mode="after")
    def _phases(self) -> RunSettings:
        sft, rl = self.sft, self.rl
        if sft is None and rl is None:
            raise ValueError("the recipe has neither an `sft` nor an `rl` phase: nothing to run")
        backend = self.backend_config()
        reference = backend.reference if backend is not None else "none"
        megatron = backend if isinstance(backend, MegatronConfig) else None  # FSDP2: neither TP nor PP
        pp = megatron.pipeline_model_parallel_size if megatron is not None else 1
        for field, algorithm in (rl.backend_algorithms() if rl is not None else {}).items():
            kl = algorithm.kl_weight
            if kl and reference == "none":
                raise ValueError(
                    f"{field}.kl_coef={kl} needs a reference policy, but backend.reference='none': set "
                    "backend.reference=frozen_copy (the policy RL starts from) or lora_base, or kl_coef=0"
                )
            if kl and pp > 1:
                raise ValueError(
                    f"{field}.kl_coef={kl} with backend.pipeline_model_parallel_size={pp}: the KL term "
                    "runs a second (reference) model forward inside the loss, which the pipeline schedule "
                    "cannot interleave; use kl_coef: 0 or pipeline_model_parallel_size: 1"
                )
        if (
            rl is not None
            and rl.lifecycle == "async"
            and self.layout.kind == "ray"
            and self.layout.sync.streaming
        ):
            raise ValueError(
                "rl.lifecycle='async' with layout.sync='broadcast': a broadcast needs sender and receivers "
                "at once, so the trainer would wait for the rollout in progress; use sync='buckets' or 'shm'"
            )
        if rl is not None and rl.buffer.partial_rollouts:
            _check_partial(rl, self.trainer)
        tp = megatron.tensor_model_parallel_size if megatron is not None else 1
        for field, size in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp)):
            if size > 1 and self.layout.kind == "ray":
                raise ValueError(
                    f"backend.{field}={size} with layout.kind='ray': the Ray train workers are "
                    f"data-parallel ranks only for now (each gets its own shard); use {field}: 1"
                )
        return self


def sft_phase(recipe: RunSettings) -> SFTPhaseBase:
    """The recipe's ``sft`` as the shared SFT loop runs it (PE runs its two stacks' phases itself)."""
    if not isinstance(recipe.sft, SFTPhaseBase):
        raise TypeError(f"the shared SFT loop needs an SFT phase; the recipe has sft={recipe.sft!r}")
    return recipe.sft


def rl_phase(plan: RLPlan | None) -> RLPhase:
    """``plan`` as the shared RL steps (``make_stack``, ``collect``) run it: an ``RLPhase``; PE's and
    the unified trainer's phases go through their trainers' own steps."""
    if not isinstance(plan, RLPhase):
        raise TypeError(f"the shared RL step needs an RLPhase; the recipe has rl={plan!r}")
    return plan


def _check_partial(rl: RLPlan, trainer: str) -> None:
    """``rl.buffer.partial_rollouts`` is an option of the AR async lifecycle (one process or Ray)."""
    if rl.lifecycle != "async":
        raise ValueError(
            "rl.buffer.partial_rollouts=true needs rl.lifecycle='async' (a sync rollout always samples "
            "with the latest weights: there is nothing to interrupt); set rl.lifecycle=async or drop it"
        )
    if trainer != "ar":
        raise ValueError(
            f"rl.buffer.partial_rollouts=true is for AR recipes (trainer='ar'); this recipe is "
            f"trainer={trainer!r}: a diffusion trajectory is not continued across weight versions. "
            "Set rl.buffer.partial_rollouts=false"
        )


def apply_phase_lr(backend: ScheduledBackend, phase: LRPhase, step: int) -> None:
    """A phase's ``lr`` and ``scheduler`` (a schedule over its own steps, positioned at ``step``,
    the phase's cursor) onto the backend's optimizer; neither set: the backend's schedule goes on.
    Only a ``PhaseLR`` has a scheduler (PE's stacks and the unified RL phase set an ``lr`` only)."""
    schedule = phase.scheduler if isinstance(phase, PhaseLR) else None
    lr = phase.lr if phase.lr is not None else float(backend.scheduler.base_lrs[0])
    if schedule is not None:
        backend.scheduler = phase_scheduler(backend.optimizer, schedule, lr, step)
    elif phase.lr is not None:
        set_base_lr(backend.optimizer, backend.scheduler, phase.lr)
