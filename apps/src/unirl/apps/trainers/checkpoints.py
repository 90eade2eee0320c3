"""The run's half of a checkpoint, beside the weights: the data cursor, the run state (report
history, metrics rows, global RNGs: ``run_state``), the algorithms' own generators and the async
lifecycle's buffer. One implementation for the single-process trainers and the Ray driver; and
``StacksCheckpoint``, the PE trainer's two stacks as one checkpoint target."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from unirl.apps.asynchronous.buffer import BufferState
from unirl.apps.run_state import RunHistory, capture, restore
from unirl.train.algorithms import DrawsOwnRNG
from unirl.train.backends import TrainBackend
from unirl.train.checkpoint import read_checkpoint_file

log = logging.getLogger("unirl")
ASYNC_BUFFER_FILE = "async_buffer.bin"
"""The async lifecycle's buffered Samples in a checkpoint (unirl's pickle-free binary form)."""
ALGORITHM_RNG_FILE = "rng-{name}-algorithm{rank}.bin"
"""The generator state of the algorithm that ``Trainer.drawing_algorithms`` calls ``name`` (FlowSFT,
DiffusionNFT draw from their own torch generator, not the global one the checkpoint's
``rng-<rank>.pt`` holds), raw bytes: ``sft`` / ``rl``, PE ``sft-diffusion`` / ``rl-ar``..., unified
``sft-image`` / ``rl-image``... ``rank`` is empty in one process, ``-<rank>`` for a Ray train rank's."""


class HasDrawingAlgorithms(Protocol):
    def drawing_algorithms(self) -> dict[str, DrawsOwnRNG]: ...


class _AsyncCheckpoint(Protocol):
    def checkpoint_state(self) -> tuple[BufferState, bytes]: ...


class CheckpointedRun(RunHistory, HasDrawingAlgorithms, Protocol):
    """What ``run_extra`` / ``restore_run`` read and write of a trainer (``Trainer``, the Ray driver)."""

    sft_step: int
    sft_done: bool
    async_state: tuple[BufferState, bytes] | None

    @property
    def async_source(self) -> _AsyncCheckpoint | None: ...


def drawing(algorithms: Mapping[str, object]) -> dict[str, DrawsOwnRNG]:
    """The ones of ``algorithms`` (None: a phase without one) that draw from their own generator."""
    return {name: a for name, a in algorithms.items() if isinstance(a, DrawsOwnRNG)}


def _file(name: str, rank: int | None) -> str:
    return ALGORITHM_RNG_FILE.format(name=name, rank="" if rank is None else f"-{rank}")


def algorithm_rng_files(trainer: HasDrawingAlgorithms, rank: int | None = None) -> dict[str, bytes]:
    """The generator state of each of ``trainer.drawing_algorithms()``, as checkpoint files
    (``rank``: of a Ray train rank, named with it)."""
    algs = trainer.drawing_algorithms().items()
    return {_file(name, rank): alg.get_rng_state().numpy().tobytes() for name, alg in algs}


def restore_algorithm_rngs(trainer: HasDrawingAlgorithms, ckpt: str | Path, rank: int | None = None) -> None:
    """Inverse of ``algorithm_rng_files``: each of ``trainer.drawing_algorithms()`` draws on where
    the checkpoint left it (one an older checkpoint lacks draws from its seed again)."""
    for name, alg in trainer.drawing_algorithms().items():
        state = read_checkpoint_file(ckpt, _file(name, rank))
        if state is not None:
            alg.set_rng_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


def run_extra(trainer: CheckpointedRun) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(JSON extra, extra files) to save with the weights: where the run is, and the async buffer's
    batches not yet trained with its cursor."""
    extra: dict[str, Any] = {
        "sft_step": trainer.sft_step,
        "rl_step": trainer.rl_step,
        "sft_done": int(trainer.sft_done),
        **capture(trainer),
    }
    files: dict[str, bytes] = {}
    if trainer.async_source is not None:
        extra["async"], files[ASYNC_BUFFER_FILE] = trainer.async_source.checkpoint_state()
    files |= algorithm_rng_files(trainer)
    return extra, files


def restore_run(trainer: CheckpointedRun, ckpt: Path, extra: dict[str, Any]) -> None:
    """Put the trainer back where ``run_extra`` found it (the weights are loaded by the caller)."""
    trainer.sft_step, trainer.rl_step = int(extra.get("sft_step", 0)), int(extra.get("rl_step", 0))
    trainer.sft_done = bool(extra.get("sft_done", False))
    restore(trainer, extra)
    restore_algorithm_rngs(trainer, ckpt)
    if "async" in extra:  # the checkpoint directory is shared with the train workers
        trainer.async_state = (extra["async"], read_checkpoint_file(ckpt, ASYNC_BUFFER_FILE) or b"")
    log.info("resumed at rl step %d (sft step %d)", trainer.rl_step, trainer.sft_step)


class StacksCheckpoint:
    """The PE trainer's stacks (name -> backend) as one backend for ``save_checkpoint`` /
    ``load_checkpoint``: one atomic checkpoint, so the two can never be restored from different
    steps. One process only."""

    rank, world_size = 0, 1

    def __init__(self, backends: dict[str, TrainBackend]) -> None:
        self.backends = backends

    @property
    def global_step(self) -> int:
        return sum(b.global_step for b in self.backends.values())

    def state_dict(self) -> dict[str, Any]:
        return {n: b.state_dict() for n, b in self.backends.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = set(self.backends) - set(state)
        if missing:
            raise ValueError(
                f"the checkpoint has no state for stack(s) {sorted(missing)}; saved: {sorted(state)}"
            )
        for n, b in self.backends.items():
            b.load_state_dict(state[n])
