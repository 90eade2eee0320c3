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
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from torch.utils._pytree import tree_map

from unirl.train.backends.common import OptimizedBackend, full_tensor
from unirl.train.backends.dist import ensure_process_group, resolve_device
from unirl.train.ema import EMAConfig, to_local_layout
from unirl.train.lora import (
    LoRAConfig,
    adapter_state_dict,
    inject_lora,
    lora_disabled,
    lora_scalings,
    merge_lora_state_dict,
)
from unirl.train.optim import AdamWConfig, ConstantSchedule, ScheduleConfig
from unirl.train.precision import PrecisionConfig

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule


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


class FSDPBackend(OptimizedBackend):
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
        self.device = resolve_device(device)
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
        if config.gradient_checkpointing and mp.param_dtype is not None:
            for block in blocks:
                cast_inputs_on_recompute(block, mp.param_dtype)
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

        trainable = {n: p for n, p in module.named_parameters() if p.requires_grad}
        self._init_optimization(
            trainable, config.optimizer, config.scheduler, config.ema, config.reference == "frozen_copy"
        )

    # -- training -------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, *, last_micro_batch: bool = True) -> None:
        """Accumulate the gradient of `loss`; with `defer_grad_sync`, ranks sync only on the last."""
        if self.config.defer_grad_sync and self.world_size > 1:
            self.module.set_requires_gradient_sync(last_micro_batch)  # type: ignore[operator]
        loss.backward()

    def all_reduce(self, values: Sequence[float], op: Literal["sum", "max"] = "sum") -> list[float]:
        """Sum or max of a few scalars over the data-parallel ranks (fp64)."""
        t = torch.tensor(list(values), dtype=torch.float64)
        if self.world_size > 1:
            t = t.to(self.device)
            dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t.cpu().tolist()

    # -- weight views ---------------------------------------------------------------------
    def _units(self) -> list[FSDPModule]:
        """Every module that `fully_shard` wrapped (each gathers and reshards on its own)."""
        from torch.distributed.fsdp import FSDPModule

        return [m for m in self.module.modules() if isinstance(m, FSDPModule)]

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Context in which every FSDP unit stays unsharded (gathered once, in the compute dtype)
        instead of all-gathering on each forward: for trainside sampling, where one rollout runs
        hundreds of forwards (decode steps, denoising steps) on unchanged weights. Costs the
        memory of the full compute-dtype weights; no gradients may be taken inside."""
        units = self._units()
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
        return self._resharded_around(self._frozen_copy_weights())

    def ema_weights(self) -> AbstractContextManager[None]:
        """Context with the EMA weights swapped into `module` (EMA rollout, DiffusionNFT's old policy)."""
        return self._resharded_around(super().ema_weights())

    @contextlib.contextmanager
    def _resharded_around(self, swap: AbstractContextManager[None]) -> Iterator[None]:
        """A swap writes the sharded parameters; with `reshard_after_forward: false` a forward leaves
        each unit's unsharded copy in place, and later forwards would read those stale copies (the
        policy's weights under the reference's name: a KL of the policy to itself). So every unit
        drops its copy before the swap and after it; the next forward gathers what is current."""
        units = self._units()
        for m in units:
            m.reshard()
        try:
            with swap:
                yield
        finally:
            for m in units:
                m.reshard()

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
            "ema": {n: full_tensor(t).cpu() for n, t in self.ema.shadow.items()} if self.ema else {},
            "global_step": self._step,
            "ema_start": self._ema_start,
        }
        if self._reference is not None:
            state["reference"] = {n: full_tensor(t).cpu() for n, t in self._reference.items()}
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


def cast_inputs_on_recompute(block: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast `block`'s floating inputs to `dtype` on EVERY call, the recomputation included.

    FSDP2's mixed-precision input cast (`cast_forward_inputs`) is skipped when activation
    checkpointing re-runs a block during backward in torch < 2.13 (pytorch/pytorch#159359): a block
    that receives fp32 inputs (FLUX.2's rotary tables) then recomputes in fp32 what its forward
    computed in bf16, and backward fails with "Recomputed values ... have different metadata".
    Registered before `fully_shard`, so it casts the same way as FSDP2's own pre-forward cast;
    casting twice is a no-op, so later torch versions are unaffected."""

    def cast(x: Any) -> Any:
        return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    def hook(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return tree_map(cast, args), tree_map(cast, kwargs)

    block.register_forward_pre_hook(hook, with_kwargs=True)


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
