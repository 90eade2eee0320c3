"""`DistributedRL`: the shared trainer lifecycle as a single controller over Ray workers.

The controller keeps what is cheap and global (data, reward, advantages, the run directory) and
drives two Remotes: ``train`` (data-parallel FSDP2 ranks) and ``rollout`` (trainside pipeline
copies, or vLLM engines with ``rollout.engine.kind: vllm``). One RL step reads top to bottom::

    prompts -> rollout (rollout workers) -> reward (controller) -> advantages (controller)
            -> train_on (call_dp: each train rank gets its shard) -> weight sync -> log

The lifecycle (evaluate, SFT, RL, checkpoints, report) is the single-process ``Trainer``'s; only
the steps that touch the model are redirected to the workers.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypedDict

from unirl.apps.distributed.layout import LayoutConfig, check_layout
from unirl.apps.distributed.workers import EngineSyncCheck, LayoutRecipe, RolloutWorker, TrainWorker
from unirl.apps.loop import StopFlag, latest_checkpoint
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.base import Trainer
from unirl.apps.trainers.checkpoints import restore_run, run_extra
from unirl.distributed import MeshShape, RayRemote, place, split_dp
from unirl.distributed.errors import WeightSyncError
from unirl.distributed.weightsync import drive_weight_sync
from unirl.reward.service import RewardService
from unirl.train.algorithms import DrawsOwnRNG
from unirl.types import Part, Sample, SamplingParams

if TYPE_CHECKING:
    from unirl.apps.asynchronous.source import RolloutSide

__all__ = ["DistributedRL", "RemoteEngine"]

log = logging.getLogger("unirl")


class RemoteEngine:
    """The rollout Remote behind the engine interface the lifecycle calls (``generate``)."""

    def __init__(self, controller: DistributedRL) -> None:
        self.controller = controller

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        d = self.controller
        d.sync_weights()  # never sample with weights older than the trainer's
        d.rollout_remote.call_all(RolloutWorker.set_step, rollout_step)
        return d.rollout_remote.call_dp(RolloutWorker.generate, samples)

    def wake_up(self) -> None:
        """A no-op: the rollout workers hold their own devices."""

    def sleep(self) -> None:
        """A no-op: the rollout workers hold their own devices."""


class SyncCheck(TypedDict, total=False):
    """One weight sync's record (``DistributedRL.sync_checks``): always version, ticket checksum,
    scope and tensor count; the weight checksums with ``layout.verify_weights``; each dedicated
    engine's own check."""

    version: int
    ticket: str
    scope: str
    tensors: int
    trainer: str
    rollout: list[str]
    engine: list[EngineSyncCheck | None]


class DistributedRL(Trainer):
    """A domain trainer (``domain``: ARTrainer, DiffusionTrainer) laid out on Ray workers."""

    cfg: LayoutRecipe

    def __init__(
        self, recipe: LayoutRecipe, run_dir: RunDir, domain: type[Trainer], layout: LayoutConfig
    ) -> None:
        check_layout(recipe, layout)
        super().__init__(recipe, run_dir)
        self.domain, self.layout, self.stage = domain, layout, domain.stage
        self.data = recipe.data.build()
        self.reward = RewardService.from_config(recipe.reward)
        alg = recipe.rl.algorithm if recipe.rl else None
        self.algorithm = alg.build() if alg is not None else None  # reward shaping only (controller side)
        self.steps = domain.make_steps(recipe, self.algorithm)  # shaping, grids, diversity: model-free
        self.dedicated = recipe.rollout.engine.kind != "trainside"
        """True when the rollout workers sample with a dedicated engine (vLLM)."""
        self.synced_version: int | None = None
        self.sync_checks: list[SyncCheck] = []
        """One entry per sync: version, ticket checksum, trainer/rollout weight checksums."""
        self._scratch = tempfile.TemporaryDirectory(prefix="unirl-workers-")
        self._start_workers()
        self.engine = RemoteEngine(self)
        try:
            self._eval_params = self.train.call_rank0(TrainWorker.eval_params)
        except BaseException:
            self.shutdown()
            raise

    # ---- workers --------------------------------------------------------------------------------
    def _start_workers(self) -> None:
        lay = self.layout
        roles = {"train": lay.train_workers, "rollout": lay.rollout_workers}
        plan, self.slabs = place(roles, lay.placement, device=lay.device, cpus_per_device=lay.cpus_per_device)
        spawn = partial(
            RayRemote.spawn, call_timeout_s=lay.call_timeout_s, startup_timeout_s=lay.startup_timeout_s
        )
        threads = lay.threads_per_worker
        self.train: RayRemote[TrainWorker] = spawn(
            partial(
                TrainWorker, domain=self.domain, recipe=self.cfg, scratch=self._scratch.name, threads=threads
            ),
            name="train",
            mesh=MeshShape(dp=lay.train_workers),
            slab=self.slabs["train"],
            share=plan.slab_of("train").share,
        )
        cls: type[RolloutWorker] = RolloutWorker
        extra: dict[str, Any] = {}  # the dedicated worker's own keywords (partial() checks none)
        if self.dedicated:  # a vLLM engine samples; the pipeline copy is its verified reference
            from unirl.apps.distributed.vllm_rollout import VLLMRolloutWorker

            cls, extra = VLLMRolloutWorker, {"scratch": self._scratch.name}
        try:
            self.rollout_remote: RayRemote[RolloutWorker] = spawn(
                partial(cls, stage=self.stage, recipe=self.cfg, threads=threads, **extra),
                name="rollout",
                mesh=MeshShape(dp=lay.rollout_workers),
                slab=self.slabs["rollout"],
                share=plan.slab_of("rollout").share,
                process_group=False,
            )
            self._setup_sync()
        except BaseException:
            self.train.shutdown()
            self._release_slabs()
            raise

    def _setup_sync(self) -> None:
        """Every worker builds its endpoint of ``layout.sync`` (the config travels, not a name)."""
        sync = self.layout.sync
        if sync.streaming:  # broadcast group: trainer rank 0 (group rank 0) + every rollout worker
            addr, port = self.train.call_rank0(TrainWorker.master)
            world = 1 + self.rollout_remote.world_size
            fut = self.train.call_all_async(TrainWorker.setup_sync, sync, addr, port, world)
            self.rollout_remote.call_all(RolloutWorker.setup_sync, sync, addr, port, world)
            fut.result(self.layout.call_timeout_s)
        else:
            self.train.call_all(TrainWorker.setup_sync, sync)
            self.rollout_remote.call_all(RolloutWorker.setup_sync, sync)

    def _release_slabs(self) -> None:
        for slab in {id(s): s for s in self.slabs.values()}.values():
            slab.release()

    def shutdown(self) -> None:
        """Stop every worker and give the devices back (a dedicated engine is closed first: a
        launched server process is no child Ray would reap)."""
        if self.dedicated and self.rollout_remote.hosts:
            try:
                self.rollout_remote.call_all_async(RolloutWorker.close).result(60.0)
            except Exception as e:  # shutting down anyway (also after a failure): report, go on
                log.warning("closing the rollout engines failed: %s", e)
        self.rollout_remote.shutdown()
        self.train.shutdown()
        self._release_slabs()
        self._scratch.cleanup()

    # ---- weight plane ---------------------------------------------------------------------------
    def sync_weights(self) -> dict[str, float]:
        """Trainer -> rollout workers, versioned by the optimizer step; a no-op when up to date.

        With LoRA only the first sync ships every parameter (the rollout copy's base weights);
        later ones ship the adapter tensors only."""
        version = self.train.call_rank0(TrainWorker.global_step)
        if self.synced_version is not None and version <= self.synced_version:
            return {}
        t0 = time.time()
        adapters_only = self.cfg.backend.lora is not None and self.synced_version is not None
        ticket = drive_weight_sync(
            self.train,
            self.rollout_remote,
            push=TrainWorker.push_adapters if adapters_only else TrainWorker.push,
            pull=RolloutWorker.pull_adapters if adapters_only else RolloutWorker.pull,
            confirm=TrainWorker.confirm,
            version=version,
            streaming=self.layout.sync.streaming,
            timeout_s=self.layout.call_timeout_s,
        )
        check: SyncCheck = {
            "version": version,
            "ticket": ticket.checksum,
            "scope": "adapters" if adapters_only else "all",
            "tensors": ticket.num_tensors,
        }
        if self.layout.verify_weights:
            want = self.train.call_all(TrainWorker.weights_checksum)[0]
            got = self.rollout_remote.call_all(RolloutWorker.weights_checksum)
            check["trainer"], check["rollout"] = want, got
            if any(g != want for g in got):
                raise WeightSyncError(
                    f"weight sync v{version}: rollout weights {got} differ from the trainer's {want}"
                )
        if self.dedicated:  # each engine verified the load (stamp, changed params, canary)
            engines = self.rollout_remote.call_all(RolloutWorker.engine_sync)
            if any(e is None or e["version"] != version for e in engines):
                raise WeightSyncError(f"weight sync v{version}: the rollout engines report {engines}")
            check["engine"] = engines
        self.sync_checks.append(check)
        self.synced_version = version
        out = {
            "weight_version": float(version),
            "weight_sync_s": time.time() - t0,
            "weight_sync_tensors": float(ticket.num_tensors),
        }
        if self.layout.verify_weights:
            out["weights_verified"] = 1.0  # reached only when every rollout checksum matched
        return out

    def train_on(self, parts: list[Part]) -> dict[str, float]:
        """Data-parallel train step: one contiguous shard per train rank; returns global metrics."""
        shards = split_dp(parts, self.train.ranks[0].dp_size)
        return self.train.call_dp(TrainWorker.train_on, shards)[0]

    # ---- domain hooks: the domain's own, where they need no model ---------------------------------
    def eval_params(self) -> SamplingParams:
        return self._eval_params

    def rollout(self, samples: list[Sample], step: int) -> list[Sample]:
        return self.engine.generate(samples, rollout_step=step)

    # ---- phase hooks: the shared loops of Trainer run on the workers ------------------------------
    def begin_phase(self, name: str, *, starting: bool = False) -> Callable[[list[Part]], dict[str, float]]:
        # the cursor too: the workers' phase LR schedule starts where the run is (a resumed phase)
        self.train.call_all(TrainWorker.begin, name, starting, (self.sft_step, self.rl_step))
        return self.train_on

    def sft_parts(self, batch_size: int, step: int) -> list[Part]:
        return self.train.call_rank0(TrainWorker.sft_parts, batch_size, step)

    def rollout_side(self) -> RolloutSide:
        """Async lifecycle: the rollout workers sample while the train workers train."""
        from unirl.apps.distributed.async_side import RayRolloutSide

        return RayRolloutSide(self)

    def after_train_step(self) -> dict[str, float]:
        if self.async_source is not None:  # async: the rollout thread pulls new weights itself
            return {}
        return self.sync_weights() | self.engine_checks()

    def engine_checks(self) -> dict[str, float]:
        """Dedicated engines: the last rollout's parity and the last sync's canary, the worst worker."""
        m: dict[str, float] = {}
        if self.dedicated:
            for wm in self.rollout_remote.call_all(RolloutWorker.metrics):
                for k, v in wm.items():
                    m[k] = max(m.get(k, v), v)
        return m

    def after_phase(self, name: str) -> None:
        self.sync_weights()

    def run_all(self, mode: str, stop: StopFlag) -> None:
        """The shared lifecycle; the workers are stopped at the end (also on failure)."""
        try:
            super().run_all(mode, stop)
        finally:
            self.shutdown()

    # ---- checkpoints (every train rank takes part) --------------------------------------------------
    def drawing_algorithms(self) -> dict[str, DrawsOwnRNG]:
        """None here: the controller's algorithm only shapes rewards; each train rank's own (FlowSFT,
        DiffusionNFT) are checkpointed per rank (``TrainWorker.algorithm_rng_files``)."""
        return {}

    def save(self) -> None:
        """Checkpoint on every train rank (``checkpoint_format``: gathered on rank 0, or one shard
        file per rank), with the data cursor, the weight version last synced and every rank's
        algorithm generators (``files/rng-<name>-algorithm-<rank>.bin``)."""
        extra, files = run_extra(self)
        extra["weight_version"] = self.synced_version
        for rank_files in self.train.call_all(TrainWorker.algorithm_rng_files):
            files |= rank_files
        path = str(self.run.checkpoints / "latest")
        self.train.call_all(TrainWorker.save, path, extra, self.cfg.checkpoint_format, files)

    def resume(self) -> bool:
        ckpt = latest_checkpoint(self.run.root)
        if ckpt is None:
            return False
        extra = self.train.call_all(TrainWorker.load, str(ckpt))[0]
        log.info("resuming from %s", ckpt)
        restore_run(self, ckpt, extra)
        return True
