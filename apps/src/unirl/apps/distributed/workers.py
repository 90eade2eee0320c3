"""The two worker roles of the Ray layout, both built from the same Recipe as the single-process run.

- :class:`TrainWorker`: one data-parallel rank. It builds the domain trainer (``ARTrainer`` /
  ``DiffusionTrainer``) inside the Remote's torch.distributed group, so its backend (FSDP2, or
  megatron-core with every rank data parallel) spans every train rank; it trains the shard the
  controller scatters to it and sends weights (rank 0 is the weight-plane source; the other ranks
  take part in the gathers) through the ``layout.sync`` plane it builds.
- :class:`RolloutWorker`: a trainside copy of the domain pipeline (bundle + pipeline + engine, no
  optimizer) that samples and receives the trained weights through the weight plane. With
  ``rollout.engine.kind: vllm`` its subclass ``VLLMRolloutWorker`` (vllm_rollout.py) samples with
  a dedicated vLLM engine and keeps the copy as the engine's verified reference.

LoRA (``backend.lora``): the rollout copy gets the same peft adapters injected, unmerged, so its
parameter names and its forward are the trainer's (base(x) + scale * B(A(x)), not a merged weight
whose rounding would shift the behaviour log-probs away from what the trainer replays). The first
sync of a rollout worker ships every parameter (the base weights it must share with the trainer);
each later one ships only the adapter tensors (``push_adapters`` / ``pull_adapters``), and the
receiver requires exactly its own adapter set to arrive.

Worker methods are plain methods: the controller (``DistributedRL``) calls them through ``Remote.call_*``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias, TypedDict

import torch

from unirl.apps.distributed.board import attach_board, catch_up, detach_board
from unirl.apps.loop import pick_device
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.ar_config import Recipe as ARRecipe
from unirl.apps.trainers.checkpoints import algorithm_rng_files, restore_algorithm_rngs
from unirl.apps.trainers.components import PolicyRecipe
from unirl.apps.trainers.diffusion_config import Recipe as DiffusionRecipe
from unirl.apps.trainers.phases import RunSettings, ScheduledBackend
from unirl.distributed.codec import Checksum
from unirl.distributed.errors import WeightSyncError
from unirl.distributed.rank import RankInfo
from unirl.distributed.weightsync import (
    Endpoint,
    EngineWeightPlane,
    LoraOnlySync,
    SyncAck,
    SyncConfig,
    SyncTicket,
    WeightSync,
    is_adapter,
)
from unirl.distributed.weightsync.protocol import full_tensor
from unirl.rollout.pipelines import Pipeline
from unirl.train.backends import ExportsHFWeights, TrainBackend
from unirl.train.checkpoint import CheckpointFormat, load_checkpoint, save_checkpoint
from unirl.train.stack import TrainStack
from unirl.types import Part, Sample, SamplingParams
from unirl.types.faults import fault_point

__all__ = [
    "RolloutWorker",
    "TrainWorker",
    "build_rollout",
    "make_weight_sync",
    "policy_tensors",
    "rollout_module",
    "weights_checksum",
]


LayoutRecipe: TypeAlias = ARRecipe | DiffusionRecipe
"""The recipes a Ray layout runs (both have ``rollout.engine``, ``backend.lora``, ``build_policy``)."""


class EngineSyncCheck(TypedDict):
    """What a dedicated engine verified at a weight sync (``RolloutWorker.engine_sync``)."""

    version: int
    checksum: str
    tensors: int
    canary_gap: float | None


def weights_checksum(module: torch.nn.Module | list[tuple[str, torch.Tensor]]) -> str:
    """XXH3-128 (`Checksum`) over (name, full tensor) of every parameter of `module` (or of the named tensors
    given), in order; a collective for FSDP2 DTensors."""
    named = module.named_parameters() if isinstance(module, torch.nn.Module) else module
    c = Checksum()
    for name, p in named:
        c.update(name, full_tensor(p.detach()).cpu())
    return c.hexdigest()


def policy_tensors(backend: TrainBackend) -> list[tuple[str, torch.Tensor]]:
    """The trained policy's parameters under the rollout copy's names, in its parameter order:
    the module's own for FSDP2 (DTensors; the sync gathers them), the Hugging Face-named,
    TP-gathered export for megatron (collective)."""
    if not isinstance(backend, ExportsHFWeights):
        return list(backend.module.named_parameters())
    weights = dict(backend.named_hf_weights())
    return [(n, weights[n]) for n in backend.hf_param_names()]


def make_weight_sync(sync: SyncConfig, at: Endpoint) -> WeightSync:
    """The worker-to-worker endpoint of ``layout.sync`` (a transport: every kind but ``engine``)."""
    plane = sync.build(at)
    if isinstance(plane, EngineWeightPlane):
        raise TypeError(f"{at.name}: layout.sync.kind='engine' cannot move weights between Ray workers")
    return plane


class TrainWorker:
    """One data-parallel train rank: the domain trainer's backend, pipeline and algorithm."""

    def __init__(
        self, info: RankInfo, *, domain: type, recipe: LayoutRecipe, scratch: str, threads: int
    ) -> None:
        self.info = info
        if recipe.rollout.engine.kind != "trainside":
            # the rollout workers own the dedicated engine; a train rank only trains
            recipe = recipe.model_copy(update={"rollout": type(recipe.rollout)()})
        # the domain trainer builds bundle, backend (FSDP2 over this Remote's group), algorithm;
        # its RunDir is a scratch dir: the controller owns the real run directory
        self.trainer = domain(recipe, RunDir(Path(scratch) / f"train{info.rank}", tensorboard=False))
        self.lora = recipe.backend.lora  # the backend's (it is built from this section)
        torch.set_num_threads(threads)
        self.stack: TrainStack | None = None
        self.sync: WeightSync | None = None
        self.lora_sync: LoraOnlySync | None = None

    @property
    def backend(self) -> ScheduledBackend:
        return self.trainer.backend

    # -- domain pieces the controller needs --------------------------------------------------------
    def eval_params(self) -> SamplingParams:
        """Sampling params of held-out evaluation."""
        return self.trainer.eval_params()

    def sft_parts(self, batch_size: int, step: int) -> list[Part]:
        """The supervised Parts of SFT step ``step`` (called on rank 0; the controller scatters them)."""
        return list(self.trainer.sft_parts(batch_size, step))

    def global_step(self) -> int:
        """Optimizer steps applied so far (the weight version)."""
        return int(self.backend.global_step)

    # -- training -----------------------------------------------------------------------------
    def begin(self, phase: str, starting: bool = False, cursor: tuple[int, int] = (0, 0)) -> None:
        """Set up the TrainStack of ``phase`` ('sft' or 'rl'), as the single-process trainer does
        (``starting``: the phase starts here, so RL's fresh optimizer / KL reference are taken on
        every rank). ``cursor``: the controller's (sft_step, rl_step), where the phase's LR
        schedule is positioned: a resumed phase goes on with its schedule where it stopped."""
        self.trainer.sft_step, self.trainer.rl_step = cursor
        self.stack = self.trainer.make_stack(phase, dp_size=self.info.dp_size, starting=starting)

    def train_on(self, shards: list[list[Part]]) -> list[dict[str, float]]:
        """Train on this rank's shard (DP dispatch of one shard per dp rank: ``shards`` holds
        exactly this rank's); losses use rank-summed totals, so metrics are global."""
        if self.stack is None:
            raise RuntimeError("TrainWorker.train_on before begin(phase)")
        if len(shards) != 1:
            raise ValueError(f"train{self.info.rank}: expected one shard, got {len(shards)}")
        fault_point(f"train_rank{self.info.rank}", int(self.backend.global_step))
        return [self.stack.train_on(shards[0])]

    # -- weight plane (source side) -------------------------------------------------------------
    def master(self) -> tuple[str, int]:
        from unirl.distributed.collective import pick_master

        return pick_master()

    def setup_sync(self, sync: SyncConfig, addr: str = "", port: int = 0, world: int = 0) -> None:
        """Build this rank's weight-plane endpoint (rank 0 joins a broadcast group as its rank 0)."""
        source = self.info.rank == 0
        group = sync.join_group(addr, port, 0, world) if source else None
        self.sync = make_weight_sync(sync, Endpoint(f"train{self.info.rank}", is_source=source, group=group))
        if self.lora is not None:  # same endpoint (and version gate), adapters only
            self.lora_sync = LoraOnlySync(self.sync)

    def _push(self, plane: WeightSync | LoraOnlySync, version: int) -> SyncTicket:
        """``plane.push`` of the weights rollout samples with (``Trainer.rollout_weights``)."""
        with self.trainer.rollout_weights():
            return plane.push(policy_tensors(self.backend), version)

    def push(self, version: int) -> SyncTicket:
        """Send every policy parameter as ``version`` (LoRA: base weights and adapters)."""
        if self.sync is None:
            raise RuntimeError("TrainWorker.push before setup_sync")
        return self._push(self.sync, version)

    def push_adapters(self, version: int) -> SyncTicket:
        """Send only the LoRA adapter tensors as ``version`` (the base weights never change)."""
        if self.lora_sync is None:
            raise RuntimeError("TrainWorker.push_adapters needs setup_sync and backend.lora")
        return self._push(self.lora_sync, version)

    def confirm(self, ticket: SyncTicket, acks: list[SyncAck], n: int) -> None:
        if self.sync is None:
            raise RuntimeError("TrainWorker.confirm before setup_sync")
        self.sync.confirm(ticket, acks, n)

    def weights_checksum(self) -> str:
        """Checksum of the policy the rollout should now hold (collective: call on every rank)."""
        with self.trainer.rollout_weights():
            return weights_checksum(policy_tensors(self.backend))

    def full_state_dict(self, merge_lora: bool = True) -> dict[str, torch.Tensor]:
        """Full CPU weights on rank 0, {} elsewhere (collective); ``merge_lora=False`` keeps peft's
        base/adapter names (the rollout copy's names)."""
        return dict(self.backend.full_state_dict(merge_lora=merge_lora))

    # -- checkpoints (collective) ---------------------------------------------------------------
    def save(
        self,
        path: str,
        extra: dict[str, Any],
        format: CheckpointFormat = "full",
        files: dict[str, bytes] | None = None,
    ) -> str:
        """Checkpoint ``format`` ('full' or 'sharded', see unirl.train.checkpoint) to ``path``, with
        the controller's extra ``files`` (e.g. the async buffer)."""
        return str(save_checkpoint(path, self.backend, extra=extra, format=format, files=files))

    def algorithm_rng_files(self) -> dict[str, bytes]:
        """This rank's algorithms' generator states (FlowSFT, DiffusionNFT), as checkpoint files
        named with its rank: the controller saves them with the checkpoint."""
        return algorithm_rng_files(self.trainer, self.info.rank)

    def load(self, path: str) -> dict[str, Any]:
        """Restore the backend, this rank's RNGs and its algorithms' generators from ``path``."""
        extra = dict(load_checkpoint(path, self.backend))
        restore_algorithm_rngs(self.trainer, path, self.info.rank)
        # the cursor too: which weights rollout samples with depends on it (``rollout_weights``)
        self.trainer.sft_step, self.trainer.rl_step = (
            int(extra.get("sft_step", 0)),
            int(extra.get("rl_step", 0)),
        )
        return extra


def build_rollout(
    recipe: RunSettings, stage: str, device: torch.device
) -> tuple[object, Pipeline, torch.nn.Module]:
    """(bundle, pipeline, trainable module) of the recipe's domain: its ``build_policy``, the one
    the trainer builds its own policy with, as a rollout copy."""
    if not isinstance(recipe, PolicyRecipe):
        raise TypeError(
            f"a {type(recipe).__name__} builds no policy: Ray layouts run the 'ar' and 'diffusion' recipes"
        )
    p = recipe.build_policy(device, stage=stage, rollout_copy=True)
    return p.bundle, p.pipeline, p.module


def rollout_module(
    recipe: RunSettings, stage: str, device: torch.device
) -> tuple[object, Pipeline, torch.nn.Module]:
    """``build_rollout`` made a rollout-only copy of the trained policy: the trainer's LoRA
    adapters injected unmerged (same names, same forward) and no gradients."""
    bundle, pipeline, module = build_rollout(recipe, stage, device)
    backend = recipe.backend_config()
    lora = backend.lora if backend is not None else None
    if lora is not None:
        from unirl.train.lora import inject_lora

        inject_lora(module, lora)  # in place: the pipeline holds the same module
    module.requires_grad_(False)
    return bundle, pipeline, module


class RolloutWorker:
    """A trainside pipeline copy that samples and receives weights through the weight plane."""

    def __init__(self, info: RankInfo, *, stage: str, recipe: LayoutRecipe, threads: int) -> None:
        from unirl.rollout.engines import TrainsideEngine

        self.info = info
        torch.set_num_threads(threads)
        torch.manual_seed(recipe.seed + 1_000 * (info.rank + 1))
        self.bundle, self.pipeline, self.module = rollout_module(recipe, stage, pick_device(recipe.device))
        lora = recipe.backend.lora
        self.engine = TrainsideEngine(self.pipeline, weight_version=0)
        self.params = dict(self.module.named_parameters())
        self.adapters = {n for n in self.params if is_adapter(n)}
        if lora is not None and not self.adapters:
            raise WeightSyncError(
                f"rollout{info.rank}: backend.lora.target_modules={lora.target_modules} bound zero adapter "
                "parameters in the rollout copy; an adapter-only sync would change nothing"
            )
        self.sync: WeightSync | None = None
        self.rollout_step = 0
        self.board: Any = None  # async lifecycle: the run's WeightBoard actor (board.py)
        self.policy_version = -1  # the async policy version held (stamped on partial rollouts' tokens)

    def set_step(self, step: int) -> None:
        """The rollout step the next ``generate`` stamps (seeds step-dependent SDE windows)."""
        self.rollout_step = step

    def generate(self, samples: list[Sample]) -> list[Sample]:
        """Sample this worker's share; Parts carry the weight version last received."""
        fault_point(f"rollout_rank{self.info.rank}", self.rollout_step)
        return self.engine.generate(samples, rollout_step=self.rollout_step)

    def weight_version(self) -> int:
        return int(self.engine.weight_version)

    def attach_board(self, board: Any, chunk_tokens: int | None) -> None:
        """Async lifecycle: take policy versions from ``board`` (``board.attach_board``)."""
        attach_board(self, board, chunk_tokens)

    def detach_board(self) -> None:
        """The async phase with partial rollouts is over (``board.detach_board``)."""
        detach_board(self)

    def catch_up(self) -> tuple[int, int]:
        """Async lifecycle: pull the board's newest version if newer (``board.catch_up``)."""
        return catch_up(self)

    def setup_sync(self, sync: SyncConfig, addr: str = "", port: int = 0, world: int = 0) -> None:
        """Build this worker's receiving endpoint of ``layout.sync`` (group rank ``1 + rank``)."""
        group = sync.join_group(addr, port, 1 + self.info.rank, world)
        self.sync = make_weight_sync(sync, Endpoint(f"rollout{self.info.rank}", is_source=False, group=group))

    def _sink(
        self, got: set[str], allowed: set[str] | None = None
    ) -> Callable[[dict[str, torch.Tensor]], None]:
        def load(bucket: dict[str, torch.Tensor]) -> None:
            for name, t in bucket.items():
                p = self.params.get(name) if allowed is None or name in allowed else None
                if p is None:
                    raise WeightSyncError(
                        f"rollout{self.info.rank}: trainer sent unknown parameter {name!r}"
                        + ("" if allowed is None else " in an adapter-only sync")
                    )
                if p.shape != t.shape:
                    raise WeightSyncError(
                        f"rollout{self.info.rank}: {name!r} arrived with shape {tuple(t.shape)}, "
                        f"the rollout copy has {tuple(p.shape)}"
                    )
                with torch.no_grad():
                    p.copy_(t)
                got.add(name)

        return load

    def pull(self, ticket: SyncTicket | None) -> SyncAck:
        """Receive, verify and load one weight version; every parameter must arrive."""
        if self.sync is None:
            raise RuntimeError("RolloutWorker.pull before setup_sync")
        got: set[str] = set()
        ack = self.sync.receive(ticket, self._sink(got))
        missing = set(self.params) - got
        if missing:
            raise WeightSyncError(
                f"rollout{self.info.rank}: weight v{ack.version} lacks {len(missing)} parameters, e.g. "
                f"{sorted(missing)[:3]}"
            )
        self._publish(ack)
        return ack

    def pull_adapters(self, ticket: SyncTicket | None) -> SyncAck:
        """Receive, verify and load one adapter-only version: exactly this copy's LoRA tensors must
        arrive (a sync that touches no adapter, or only some, fails loudly)."""
        if self.sync is None:
            raise RuntimeError("RolloutWorker.pull_adapters before setup_sync")
        if not self.adapters:
            raise WeightSyncError(f"rollout{self.info.rank}: adapter-only sync, but this copy has no LoRA")
        got: set[str] = set()
        ack = self.sync.receive(ticket, self._sink(got, self.adapters))
        if got != self.adapters:
            missing = sorted(self.adapters - got)
            raise WeightSyncError(
                f"rollout{self.info.rank}: adapter-only weight v{ack.version} loaded {len(got)} of "
                f"{len(self.adapters)} adapter tensors; missing e.g. {missing[:3]}"
            )
        self._publish(ack)
        return ack

    def _publish(self, ack: SyncAck) -> None:
        """Serve the weights just loaded into ``self.module`` as version ``ack.version``."""
        self.engine.set_weight_version(ack.version)

    def engine_sync(self) -> EngineSyncCheck | None:
        """What a dedicated engine verified at the last sync (None: the trainside copy has none)."""
        return None

    def metrics(self) -> dict[str, float]:
        """Rollout-side guard metrics of the last rollout / sync (trainside: none)."""
        return {}

    def close(self) -> None:
        """Release what the worker started outside its own process (trainside: nothing)."""
        return None

    def weights_checksum(self) -> str:
        return weights_checksum(self.module)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The rollout copy's module state (tied weights under every name), cloned."""
        return {k: v.detach().clone() for k, v in self.module.state_dict().items()}
