"""How a run is laid out: one process (``single``) or a single controller driving Ray workers (``ray``).

A recipe switches layout by config only::

    layout: {kind: ray, placement: colocate, train_workers: 2, rollout_workers: 1, sync: buckets}
    layout: {kind: ray, device: gpu, sync: {kind: cuda_ipc, max_bucket_bytes: 134217728}}

``train_workers`` data-parallel FSDP2 ranks (gloo on CPU, NCCL on GPU) train; ``rollout_workers``
hold a trainside copy of the pipeline and receive the trained weights through the weight plane
(with ``backend.lora``: the base weights once, then only the adapter tensors). ``sync`` is the
weight plane (``unirl.distributed.weightsync.config``: broadcast | buckets | shm | cuda_ipc |
engine; a plain kind name or a mapping with that kind's options). With ``rollout.engine.kind:
vllm`` each rollout worker samples with its own vLLM engine and pushes every received version into
it through the ``engine`` plane (verified); LoRA with vLLM is rejected by the AR recipe itself.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from unirl.distributed.weightsync.config import BucketsSync, SyncConfig
from unirl.rollout.engines.vllm_config import VLLMEngineConfig
from unirl.train.geometry import BatchGeometry

__all__ = ["LaidOutRecipe", "LayoutConfig", "check_layout", "ensure_ray"]


class _RLBatch(Protocol):
    @property
    def steps(self) -> int: ...

    @property
    def prompts_per_step(self) -> int: ...

    @property
    def samples_per_prompt(self) -> int: ...

    @property
    def geometry(self) -> BatchGeometry: ...


class _SFTBatch(Protocol):
    @property
    def steps(self) -> int: ...

    @property
    def batch_size(self) -> int: ...


class _Engine(Protocol):
    @property
    def kind(self) -> str: ...


class _Rollout(Protocol):
    @property
    def engine(self) -> _Engine: ...


class LaidOutRecipe(Protocol):
    """What ``check_layout`` reads of a recipe (the AR and diffusion recipes a Ray layout runs)."""

    @property
    def rl(self) -> _RLBatch | None: ...

    @property
    def sft(self) -> _SFTBatch | None: ...

    @property
    def rollout(self) -> _Rollout: ...


class LayoutConfig(BaseModel):
    """Process layout of a run; the default (``single``) runs everything in the calling process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["single", "ray"] = "single"
    placement: Literal["colocate", "separate"] = Field(
        default="colocate",
        description="colocate: trainer and rollout workers share one device slab (each takes a share of "
        "every device); separate: each role gets its own devices. No effect with kind=single.",
    )
    train_workers: int = Field(default=1, ge=1, description="data-parallel train ranks (FSDP2 world size)")
    rollout_workers: int = Field(default=1, ge=1, description="rollout workers (samples are split over them)")
    sync: SyncConfig = Field(
        default_factory=BucketsSync,
        description="weight plane between the train and rollout workers (kind=ray): broadcast (gloo/NCCL "
        "group trainer rank 0 + rollout workers), buckets (safetensors through the Ray object store), shm "
        "(CPU shared memory, one node) or cuda_ipc (GPU, colocate). A plain kind name or {kind: ..., "
        "max_bucket_bytes: ...}. No effect with kind=single, where a dedicated engine (vLLM, SGLang) always "
        "gets the 'engine' plane (its own update_weights); 'engine' is refused with kind=ray",
    )
    device: Literal["cpu", "gpu"] = Field(default="cpu", description="what one slab 'device' is")
    cpus_per_device: float = Field(
        default=1.0, gt=0, description="Ray CPUs per device bundle (fractional on a shared laptop)"
    )
    threads_per_worker: int = Field(default=1, ge=1, description="torch CPU threads in each worker")
    verify_weights: bool = Field(
        default=False,
        description="after every sync also compare a checksum of the rollout worker's live weights with "
        "the trainer's (on top of the per-bucket checksums the weight plane always checks); costs one "
        "more full gather per sync, so it is a debugging/test aid",
    )
    ray_address: str | None = Field(
        default=None,
        description="connect to this Ray cluster; None: join the running one or start a local one",
    )
    call_timeout_s: float = Field(
        default=600.0, gt=0, description="deadline of one worker call: a hung worker fails the run after it"
    )
    startup_timeout_s: float = Field(
        default=600.0, gt=0, description="deadline for the workers to start (build their models)"
    )

    @model_validator(mode="after")
    def _sync_fits(self) -> LayoutConfig:
        self.sync.check_layout(kind=self.kind, device=self.device, placement=self.placement)
        return self


def check_layout(recipe: LaidOutRecipe, layout: LayoutConfig) -> None:
    """Raise ValueError when the recipe's batches cannot be split over ``layout.train_workers``, or
    its dedicated engine cannot serve ``layout.rollout_workers``.

    The RL geometry is per rank (``rl.geometry`` sizes count Parts on one rank), so each rank's
    shard ``prompts_per_step * samples_per_prompt / train_workers`` must be a valid shard.
    """
    engine = recipe.rollout.engine
    url = engine.url if isinstance(engine, VLLMEngineConfig) else None  # a server to attach to
    if layout.kind == "ray" and url and layout.rollout_workers > 1:
        # every rollout worker pushes each version into its own engine; sharing one server, the
        # second push of a version would change nothing and fail the no-op-sync guard
        raise ValueError(
            f"rollout.engine.url={url!r} with layout.rollout_workers={layout.rollout_workers}: "
            "rollout workers cannot share one attached vLLM server; use rollout_workers=1, or leave "
            "rollout.engine.url unset so each worker starts its own engine"
        )
    n = layout.train_workers
    rl = recipe.rl
    if rl is not None and rl.steps:
        total = rl.prompts_per_step * rl.samples_per_prompt
        if total % n:
            raise ValueError(
                f"layout.train_workers={n} does not divide the RL batch (rl.prompts_per_step * "
                f"rl.samples_per_prompt = {total}); pick a divisor or change the batch"
            )
        try:
            rl.geometry.check_shard(total // n)
        except ValueError as e:
            raise ValueError(
                f"rl.geometry with layout.train_workers={n} (per-rank shard {total // n}): {e}"
            ) from None
    sft = recipe.sft
    if sft is not None and sft.steps and sft.batch_size % n:
        raise ValueError(
            f"layout.train_workers={n} does not divide sft.batch_size={sft.batch_size}; pick a divisor"
        )


def ensure_ray(layout: LayoutConfig) -> None:
    """Join ``layout.ray_address``, the running Ray instance, or start a local one."""
    import ray

    from unirl.types.faults import kill_together

    if not ray.is_initialized():
        kill_together()  # tests: a worker killed at a fault point takes this driver with it
        ray.init(address=layout.ray_address, include_dashboard=False)
