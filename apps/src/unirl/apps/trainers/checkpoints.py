"""The run's half of a checkpoint, beside the weights: the data cursor, the run state (report
history, metrics rows, global RNGs: ``run_state``) and the async lifecycle's buffer. One
implementation for the single-process trainers and the Ray driver."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from unirl.apps.run_state import capture, restore
from unirl.train.checkpoint import read_checkpoint_file

log = logging.getLogger("unirl")
ASYNC_BUFFER_FILE = "async_buffer.bin"
"""The async lifecycle's buffered Samples in a checkpoint (unirl's pickle-free binary form)."""
ALGORITHM_RNG_FILE = "rng-{phase}-algorithm.bin"
"""The generator state of phase ``phase``'s algorithm (FlowSFT, DiffusionNFT draw from their own
torch generator, not the global one the checkpoint's ``rng-<rank>.pt`` holds): raw bytes."""


def _drawing_algorithms(trainer: Any) -> dict[str, Any]:
    """phase -> the algorithm of that phase that has its own generator (``get_rng_state``)."""
    algs = {"sft": trainer.sft_algorithm(), "rl": trainer.algorithm}
    return {phase: a for phase, a in algs.items() if hasattr(a, "get_rng_state")}


def run_extra(trainer: Any) -> tuple[dict[str, Any], dict[str, bytes]]:
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
    for phase, alg in _drawing_algorithms(trainer).items():
        files[ALGORITHM_RNG_FILE.format(phase=phase)] = alg.get_rng_state().numpy().tobytes()
    return extra, files


def restore_run(trainer: Any, ckpt: Path, extra: dict[str, Any]) -> None:
    """Put the trainer back where ``run_extra`` found it (the weights are loaded by the caller)."""
    trainer.sft_step, trainer.rl_step = int(extra.get("sft_step", 0)), int(extra.get("rl_step", 0))
    trainer.sft_done = bool(extra.get("sft_done", False))
    restore(trainer, extra)
    for phase, alg in _drawing_algorithms(trainer).items():
        state = read_checkpoint_file(ckpt, ALGORITHM_RNG_FILE.format(phase=phase))
        if state is not None:  # a checkpoint written before these were saved draws from the seed again
            alg.set_rng_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    if "async" in extra:  # the checkpoint directory is shared with the train workers
        trainer.async_state = (extra["async"], read_checkpoint_file(ckpt, ASYNC_BUFFER_FILE) or b"")
    log.info("resumed at rl step %d (sft step %d)", trainer.rl_step, trainer.sft_step)
