"""`VLLMRolloutWorker`: a Ray rollout worker that samples with a dedicated vLLM engine.

It is a :class:`RolloutWorker` (same weight-plane endpoint, same sink that loads every bucket
into the worker's trainside copy of the model) whose sampler is a ``VLLMEngine`` started from
that copy's initial weights. After each sync the copy holds the trainer's weights exactly (every
bucket checksummed by the weight plane, every parameter required); the worker then hands the
copy's parameters (Hugging Face names, a tied head once) to vLLM through the ``engine`` weight
plane (``EngineWeightPlane``: ``engine.update_weights``, which checks the bytes vLLM loaded
against their stamp, that vLLM's own parameters changed, and that a canary sequence scores the
same in vLLM and in the copy). The copy is also the engine's parity
``reference``: each rollout's vLLM log-probs are compared with its replay (``parity_bound``).

vLLM runs in the actor's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni``
executor): no fork of a multi-threaded Ray worker, and when Ray kills the actor nothing is
left behind. ``mode: server`` still launches a server process; ``close`` (called by the controller
before it kills the actors) stops it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from unirl.apps.distributed.workers import EngineSyncCheck, RolloutWorker
from unirl.apps.trainers.ar_config import Recipe as ARRecipe
from unirl.distributed.rank import RankInfo
from unirl.distributed.weightsync import Endpoint, EngineSync, SyncAck, module_weights, stamp_of
from unirl.rollout.ar import ARPipeline, CausalLMBundle
from unirl.rollout.engines.vllm_config import VLLMEngineConfig
from unirl.types import Sample

__all__ = ["VLLMRolloutWorker"]


class VLLMRolloutWorker(RolloutWorker):
    """A rollout worker whose samples come from vLLM (``rollout.engine.kind: vllm``)."""

    def __init__(self, info: RankInfo, *, stage: str, recipe: ARRecipe, threads: int, scratch: str) -> None:
        from unirl.apps.trainers.ar_config import engine_model_dir

        super().__init__(info, stage=stage, recipe=recipe, threads=threads)
        bundle, pipeline, engine = self.bundle, self.pipeline, recipe.rollout.engine
        if not (
            isinstance(bundle, CausalLMBundle)
            and isinstance(pipeline, ARPipeline)
            and isinstance(engine, VLLMEngineConfig)
        ):
            raise TypeError(
                f"rollout{info.rank}: a vLLM rollout worker needs a text AR recipe with a vLLM engine"
            )
        # before vLLM is imported: its engine core runs in this process (see the module doc)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        model_dir = engine_model_dir(recipe, bundle, Path(scratch) / f"rollout{info.rank}_engine_init")
        initial = stamp_of(module_weights(self.module), 0)  # only its checksum is used
        # version -1: the start-up weights are no trainer version; the controller syncs before sampling
        # a VLLMEngine (its config's build() is untyped), in place of the trainside engine
        self.engine: Any = engine.build(
            pipeline,
            model_dir,
            reference=self.module,
            weight_version=-1,
            weight_checksum=initial.checksum,
        )
        self.engine_plane = EngineSync().build(
            Endpoint(f"rollout{info.rank} vLLM engine", is_source=True, engine=self.engine)
        )
        self.last_sync: EngineSyncCheck | None = None

    def generate(self, samples: list[Sample]) -> list[Sample]:
        if self.last_sync is None:
            raise RuntimeError(
                f"rollout{self.info.rank}: vLLM asked to sample before the first weight sync; "
                "the controller must sync the trainer's weights first"
            )
        return super().generate(samples)

    def _publish(self, ack: SyncAck) -> None:
        """Push the copy's freshly loaded weights into vLLM as ``ack.version`` (verified there)."""
        ticket = self.engine_plane.push(self.module.named_parameters(), ack.version)
        self.last_sync = {
            "version": ticket.version,
            "checksum": ticket.checksum,
            "tensors": ticket.num_tensors,
            "canary_gap": self.engine.last_canary_gap,
        }

    def engine_sync(self) -> EngineSyncCheck | None:
        return self.last_sync

    def metrics(self) -> dict[str, float]:
        return dict(self.engine.metrics())

    def close(self) -> None:
        self.engine.close()
