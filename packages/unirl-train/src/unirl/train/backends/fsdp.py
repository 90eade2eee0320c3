"""FSDPBackend: any diffusers / transformers module trained under torch FSDP2 (`fully_shard`).

Structure injection happens once, in this order: LoRA (peft) -> gradient checkpointing ->
move to device -> `fully_shard` on every block class (default: the model's `_no_split_modules`)
and then on the root -> frozen reference copy / EMA -> AdamW + LR schedule over the trainable
parameters. Gradients are summed (not averaged) over ranks because every loss is already
normalised by global, rank-summed BatchTotals. The same code path serves world size 1 (a gloo group is created when none exists)
and larger data-parallel worlds (launch one process per rank; the mesh spans the whole world).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field

from unirl.train.backends.base import StepStats
from unirl.train.backends.dist import ensure_process_group
from unirl.train.ema import EMA, EMAConfig, swapped_weights, to_local_layout
from unirl.train.lora import (
    LoRAConfig,
    adapter_state_dict,
    inject_lora,
    lora_disabled,
    lora_scalings,
    merge_lora_state_dict,
)
from unirl.train.optim import AdamWConfig, ConstantSchedule, ScheduleConfig, build_scheduler
from unirl.train.precision import PrecisionConfig


class FSDPConfig(BaseModel):
    """Configuration of `FSDPBackend`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fsdp"] = "fsdp"
    optimizer: AdamWConfig
    scheduler: ScheduleConfig = Field(default_factory=ConstantSchedule)
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig)
    grad_clip: float | None = Field(
        default=1.0, gt=0, description="Clip the total grad norm to this; None = no clipping."
    )
    ema: EMAConfig | None = Field(default=None, description="EMA of the trainable params; None = off.")
    lora: LoRAConfig | None = Field(default=None, description="Train LoRA adapters only; None = full.")
    gradient_checkpointing: bool = False
    reference: Literal["none", "frozen_copy", "lora_base"] = Field(
        default="none",
        description="Reference policy for KL: a frozen copy of the initial trainable weights, or the "
        "LoRA-disabled base model (needs lora).",
    )
    shard_modules: list[str] | None = Field(
        default=None,
        description="Class names wrapped by their own fully_shard; None = the model's _no_split_modules.",
    )
    reshard_after_forward: bool = True
    defer_grad_sync: bool = Field(
        default=False,
        description="Reduce-scatter gradients once per optimizer step (after the last micro-batch) "
        "instead of after every micro-batch: fewer collectives, but unsharded gradients are held "
        "between micro-batches. No effect at world size 1.",
    )

    def build(self, module: torch.nn.Module, device: torch.device | str | None = None) -> FSDPBackend:
        """Wrap `module` (modified in place) in an FSDPBackend."""
        return FSDPBackend(module, self, device=device)


def default_device() -> torch.device:
    """cuda:LOCAL_RANK when CUDA is available, else cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


class FSDPBackend:
    """Owns an FSDP2-sharded module, its optimizer, LR schedule, EMA and reference weights."""

    def __init__(
        self, module: torch.nn.Module, config: FSDPConfig, device: torch.device | str | None = None
    ) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if config.reference == "lora_base" and config.lora is None:
            raise ValueError(
                "reference='lora_base' needs lora to be set; use reference='frozen_copy' instead"
            )
        self.config = config
        self.device = torch.device(device) if device is not None else default_device()
        if self.device.type == "cuda" and self.device.index is None:  # "cuda" means this rank's GPU
            self.device = default_device()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        ensure_process_group(self.device)
        self.mesh = init_device_mesh(self.device.type, (dist.get_world_size(),))

        if config.lora is not None:
            module = inject_lora(module, config.lora)
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(module)
        module.to(self.device)

        mp = config.precision.policy(self.device)
        names = set(config.shard_modules or getattr(module, "_no_split_modules", None) or [])
        blocks = [m for m in module.modules() if m is not module and type(m).__name__ in names]
        for block in blocks:
            fully_shard(
                block, mesh=self.mesh, mp_policy=mp, reshard_after_forward=config.reshard_after_forward
            )
        fully_shard(module, mesh=self.mesh, mp_policy=mp, reshard_after_forward=config.reshard_after_forward)
        # Losses are already divided by GLOBAL BatchTotals (summed over ranks), so the gradient
        # reduction must SUM over ranks; FSDP2's default would average (divide by world size).
        # Plain SUM collectives (not PREMUL_SUM(1.0), which gloo lacks).
        for m in (*blocks, module):
            m.set_gradient_divide_factor(1.0)  # type: ignore[operator]
            m.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
        self.module = module
        self.num_sharded_blocks = len(blocks)

        self.trainable: dict[str, torch.nn.Parameter] = {
            n: p for n, p in module.named_parameters() if p.requires_grad
        }
        self.optimizer = config.optimizer.build(self.trainable.values(), self.device)
        self.scheduler = build_scheduler(self.optimizer, config.scheduler)
        self.ema = EMA(self.trainable, config.ema) if config.ema is not None else None
        self._reference: dict[str, torch.Tensor] | None = None
        if config.reference == "frozen_copy":
            self.snapshot_reference()
        self._step = 0
        self._ema_start = 0  # the step the EMA (re)started at: its ramp counts updates from there

    # -- identity -------------------------------------------------------------------------
    @property
    def global_step(self) -> int:
        """Optimizer steps applied so far (skipped non-finite steps do not count)."""
        return self._step

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    # -- training -------------------------------------------------------------------------
    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, *, last_micro_batch: bool = True) -> None:
        """Accumulate the gradient of `loss`; with `defer_grad_sync`, ranks sync only on the last."""
        if self.config.defer_grad_sync and self.world_size > 1:
            self.module.set_requires_gradient_sync(last_micro_batch)  # type: ignore[operator]
        loss.backward()

    def reset_optimizer(self) -> None:
        """Drop the optimizer's per-parameter state (AdamW's moments and step counts); the
        weights, the schedule, the EMA and `global_step` are kept. A new phase that should not
        inherit the previous phase's moments (RL after SFT) calls this before its first step."""
        self.optimizer.state.clear()

    def restart_ema(self) -> None:
        """Restart the EMA at the current weights, its decay ramp from its first update (``d_k``
        with k counted from here). A phase whose EMA should not average the previous phase's
        weights (DiffusionNFT's old policy, RL after SFT) calls this before its first step."""
        if self.ema is None:
            raise ValueError("restart_ema() needs backend.ema to be configured (e.g. ema: {decay: 0.9})")
        self.ema.reset()
        self._ema_start = self._step

    def snapshot_reference(self) -> None:
        """Make the current trainable weights the frozen KL reference (``reference='frozen_copy'``).

        The copy is first taken when the backend is built; a phase that regularises towards the
        policy it starts from (RL after SFT) takes it again at its first step. It is checkpointed,
        so a resumed run keeps the reference its RL phase started with."""
        if self.config.reference != "frozen_copy":
            raise ValueError(
                f"snapshot_reference() needs backend.reference='frozen_copy' (got {self.config.reference!r})"
            )
        self._reference = {n: p.detach().clone() for n, p in self.trainable.items()}

    def step(self) -> StepStats:
        """Clip to `grad_clip`, skip on a non-finite norm, else AdamW + schedule + EMA."""
        params = list(self.trainable.values())
        max_norm = self.config.grad_clip if self.config.grad_clip is not None else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, error_if_nonfinite=False)
        grad_norm = float(_full(norm))
        lr = float(self.scheduler.get_last_lr()[0])
        if not math.isfinite(grad_norm):
            self.zero_grad()
            return StepStats(grad_norm=grad_norm, lr=lr, skipped_nonfinite=True, global_step=self._step)
        self.optimizer.step()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self._step - self._ema_start)
        self._step += 1
        self.zero_grad()
        return StepStats(grad_norm=grad_norm, lr=lr, skipped_nonfinite=False, global_step=self._step)

    def all_reduce(self, values: Sequence[float], op: Literal["sum", "max"] = "sum") -> list[float]:
        """Sum or max of a few scalars over the data-parallel ranks (fp64)."""
        t = torch.tensor(list(values), dtype=torch.float64)
        if self.world_size > 1:
            t = t.to(self.device)
            dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t.cpu().tolist()

    # -- weight views ---------------------------------------------------------------------
    def ema_weights(self) -> AbstractContextManager[None]:
        """Context with the EMA weights swapped into `module` (EMA rollout, DiffusionNFT's old policy)."""
        if self.ema is None:
            raise ValueError("ema_weights() needs backend.ema to be configured (e.g. ema: {decay: 0.9})")
        return self.ema.applied()

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Context in which every FSDP unit stays unsharded (gathered once, in the compute dtype)
        instead of all-gathering on each forward: for trainside sampling, where one rollout runs
        hundreds of forwards (decode steps, denoising steps) on unchanged weights. Costs the
        memory of the full compute-dtype weights; no gradients may be taken inside."""
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in self.module.modules() if isinstance(m, FSDPModule)]
        for m in units:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        try:
            yield
        finally:
            for m in units:
                m.reshard()
                m.set_reshard_after_forward(self.config.reshard_after_forward, recurse=False)

    def reference_weights(self) -> AbstractContextManager[None]:
        """Context in which `module` is the frozen reference policy (for KL terms)."""
        if self.config.reference == "lora_base":
            return lora_disabled(self.module)
        if self._reference is not None:
            return swapped_weights(self.trainable, self._reference)
        raise ValueError("reference_weights() needs backend.reference='frozen_copy' or 'lora_base'")

    def full_state_dict(self, merge_lora: bool = True) -> dict[str, torch.Tensor]:
        """Full CPU weights (on rank 0; other ranks get {}); LoRA merged into base keys by default."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd: dict[str, torch.Tensor] = get_model_state_dict(  # type: ignore[assignment]  # model sds hold tensors
            self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if merge_lora and self.config.lora is not None and sd:
            sd = merge_lora_state_dict(sd, lora_scalings(self.module))
        return sd

    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA adapter weights only (peft file layout, CPU, on rank 0) for LoRA-only weight sync."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.config.lora is None:
            raise ValueError("lora_state_dict() needs backend.lora to be configured")
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        return adapter_state_dict(get_model_state_dict(self.module, options=opts))  # type: ignore[arg-type]

    # -- checkpoint state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Full CPU state of the trainable params, optimizer, scheduler, EMA and step (collective).

        Frozen parameters are left out: they come back from the model's own weights on rebuild.
        The result is a snapshot: on CPU, where `cpu_offload` would hand back views of the live
        parameters and optimizer state, tensors are copied.
        """
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        state = {
            "model": get_model_state_dict(self.module, options=opts),
            "optimizer": get_optimizer_state_dict(self.module, self.optimizer, options=opts),
            "scheduler": self.scheduler.state_dict(),
            "ema": {n: _full(t).cpu() for n, t in self.ema.shadow.items()} if self.ema else {},
            "global_step": self._step,
            "ema_start": self._ema_start,
        }
        if self._reference is not None:
            state["reference"] = {n: _full(t).cpu() for n, t in self._reference.items()}
        # Off CPU, cpu_offload already copied every tensor to host memory.
        return _snapshot(state) if self.device.type == "cpu" else state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output (every rank passes the full state)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        missing = set(self.trainable) - set(state["model"])
        # remove_duplicate=False: tied weights (e.g. lm_head tied to the embeddings) are saved under
        # both names, so both are known on load.
        known = {n for n, _ in self.module.named_parameters(remove_duplicate=False)}
        known |= {n for n, _ in self.module.named_buffers(remove_duplicate=False)}
        unexpected = set(state["model"]) - known
        if missing or unexpected:
            raise ValueError(
                f"checkpoint model state does not match the trainable parameters: missing "
                f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]} (same lora config?)"
            )
        self._load(state, StateDictOptions(full_state_dict=True, strict=False))

    def _load(self, state: dict[str, Any], opts: Any) -> None:
        """Model and optimizer (with ``opts``), scheduler, EMA and step, from either state layout."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        set_model_state_dict(self.module, state["model"], options=opts)
        set_optimizer_state_dict(self.module, self.optimizer, state["optimizer"], options=opts)
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        if self._reference is not None and "reference" in state:  # older checkpoints have none
            with torch.no_grad():
                for n, r in self._reference.items():
                    r.copy_(to_local_layout(state["reference"][n], r))
        self._step = int(state["global_step"])
        self._ema_start = int(state.get("ema_start", 0))  # older checkpoints: the EMA never restarted

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's view of the state (collective-free): trainable params, optimizer moments and
        EMA as FSDP2 DTensors (local shards, no gather), scheduler and step as plain values.

        The tensors are the live ones where torch hands them out (write them before the next
        step); used by the sharded checkpoint format."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(ignore_frozen_params=True)
        state = {
            "model": get_model_state_dict(self.module, options=opts),
            "optimizer": get_optimizer_state_dict(self.module, self.optimizer, options=opts),
            "scheduler": self.scheduler.state_dict(),
            "ema": dict(self.ema.shadow) if self.ema else {},
            "global_step": self._step,
            "ema_start": self._ema_start,
        }
        if self._reference is not None:
            state["reference"] = dict(self._reference)
        return state

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `sharded_state_dict()` output laid out for this rank (DTensors of this mesh)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        self._load(state, StateDictOptions(strict=False))  # frozen params are not in the state


def enable_gradient_checkpointing(module: Any) -> None:
    """diffusers `enable_gradient_checkpointing()`, or transformers `activation_checkpointing_enable()`
    (transformers >= 5) / `gradient_checkpointing_enable()` (older), non-reentrant."""
    if hasattr(module, "enable_gradient_checkpointing"):
        module.enable_gradient_checkpointing()
    elif hasattr(module, "activation_checkpointing_enable"):
        module.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(module, "gradient_checkpointing_enable"):
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        raise ValueError(
            f"gradient_checkpointing=True but {type(module).__name__} has neither "
            "enable_gradient_checkpointing() (diffusers) nor gradient_checkpointing_enable() (transformers)"
        )


def _snapshot(tree: Any) -> Any:
    """A copy of a nested dict/list state whose tensors share no storage with live state."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: _snapshot(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_snapshot(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_snapshot(v) for v in tree)
    return tree


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (collective), or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
