"""Running megatron-core on a machine without CUDA (the CPU test tier and the laptop default).

megatron-core's layers are plain torch, but a few of its helpers name the CUDA device outright:
`torch.cuda.current_device()` for where to allocate (embeddings, RoPE frequencies), the CUDA
RNG state tracker that tensor-parallel regions fork, and the CUDA RNG state that activation
recomputation saves and restores. `install()` points the first at the CPU, puts a tracker over
torch's CPU generator in place of the second and makes the third an empty state; nothing else is changed, so
the GPTModel, its tensor-parallel layers and their gloo collectives are megatron-core's own.
On a CUDA machine it does nothing. megatron-core's optimizers allocate on CUDA too; the backend
does not use them.

Pipeline parallelism meets three more CUDA names, each patched only as far as it reaches:
`torch.cuda.synchronize()` after the p2p shape exchange of ``variable_seq_lengths``
(`P2PCommunicator._communicate_shapes`; a no-op here: gloo's sends complete before ``wait``
returns), ``torch.zeros(..., device="cuda")`` for the token count of every schedule
(`forward_backward_*`), and ``weight.data.cuda()`` where a tied output layer on the last stage
first copies the embedding of the first (`LanguageModule.setup_embeddings_and_output_layer`).
The last two run inside `cuda_as_cpu()`, a torch-function mode that maps a ``cuda`` device to
the CPU, entered around model construction and the schedule only (and suspended around the
model's compute inside the schedule, `compute_outside_cuda_as_cpu()`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

_SEED = 2718  # megatron-core's own default model-parallel seed offset


def install() -> None:
    """Make megatron-core's model code runnable on CPU (idempotent; no-op when CUDA exists)."""
    if torch.cuda.is_available():
        return
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
    torch.cuda.synchronize = _no_synchronize  # type: ignore[assignment]
    # activation recomputation saves and restores "all" RNG states: the CPU one (kept) and the
    # CUDA one (none here)
    mrandom._get_cuda_rng_state = _no_cuda_rng_state
    mrandom._set_cuda_rng_state = _ignore_cuda_rng_state
    if isinstance(mrandom._CUDA_RNG_STATE_TRACKER, CPURNGStatesTracker):
        return

    tracker = CPURNGStatesTracker()
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, _SEED)
    mrandom._CUDA_RNG_STATE_TRACKER = tracker
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def _cpu_device() -> torch.device:
    return torch.device("cpu")


def _no_synchronize(device: object = None) -> None:
    return None


def _is_cuda(device: object) -> bool:
    return (isinstance(device, str) and device.startswith("cuda")) or (
        isinstance(device, torch.device) and device.type == "cuda"
    )


class _CudaAsCPU(TorchFunctionMode):
    """``device="cuda"`` -> CPU for torch functions, and ``Tensor.cuda()`` -> the tensor itself."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if _is_cuda(kwargs.get("device")):
            kwargs = {**kwargs, "device": torch.device("cpu")}
        return func(*args, **kwargs)


def cuda_as_cpu() -> contextlib.AbstractContextManager[object]:
    """Context in which megatron-core's hard-coded ``cuda`` allocations land on the CPU (no-op
    with CUDA)."""
    if torch.cuda.is_available():
        return contextlib.nullcontext()
    return _CudaAsCPU()


@contextlib.contextmanager
def compute_outside_cuda_as_cpu() -> Iterator[None]:
    """Suspend an active `cuda_as_cpu()` mode around model compute inside the schedule: the mode
    costs a Python call per torch op (~30% of the tiny test model's forward + backward), and the
    model's own allocations need no mapping (`install()` covers them)."""
    stack = torch.overrides._get_current_function_mode_stack()
    if not stack or not isinstance(stack[-1], _CudaAsCPU):
        yield
        return
    with torch.overrides._pop_mode_temporarily():
        yield


def _no_cuda_rng_state(*args: object, **kwargs: object) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


def _ignore_cuda_rng_state(*args: object, **kwargs: object) -> None:
    return None


def _tracker_base() -> type:
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    return CudaRNGStatesTracker


class CPURNGStatesTracker(_tracker_base()):  # type: ignore[misc]
    """megatron-core's named RNG states, kept as torch CPU generator states."""

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_ or name in self.states_:
            raise ValueError(f"RNG state {name!r} / seed {seed} already added")
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            raise ValueError(f"RNG state {name!r} was not added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)
