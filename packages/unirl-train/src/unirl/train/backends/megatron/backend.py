"""MegatronBackend: a Hugging Face causal LM trained as a megatron-core GPTModel.

Built once, in this order: process group -> megatron-core parallel state (TP groups inside the
world; the rest of the world is data parallel) -> mbridge bridge for the model's family ->
GPTModel of this rank (local or Transformer Engine layer spec) -> the Hugging Face weights split
into it -> AdamW + schedule + EMA + frozen reference over its parameters (the same optimizer
code as FSDPBackend, so the two backends take the same step from the same gradient).

`module` is the GPTModel behind the Hugging Face forward the pipelines call (`MegatronCausalLM`):
the replay and every loss run through megatron-core. The Hugging Face module the backend was
built from stays as the rollout copy: `gathered()` (the trainside sampling context) first loads
the trained weights into it when it is behind, so KV-cached decode runs on Hugging Face code.

Gradients: losses are already divided by global, rank-summed BatchTotals, so gradients are
summed over data-parallel ranks; tensor-parallel shards count once in the gradient norm; the
replicated weights whose gradient each TP rank holds only a part of (the per-head QK norms, and
the norms under sequence parallelism) are summed over the TP ranks, as megatron-core's
finalize_model_grads does.

Checkpoint state is Hugging Face-named and TP-gathered (weights, AdamW moments, EMA, reference),
so it loads at any tensor-parallel size; the `sharded` checkpoint format writes it as safetensors
(no pickle) and resumes at another world size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal

import torch
import torch.distributed as dist

from unirl.train.backends.common import OptimizedBackend
from unirl.train.backends.dist import ensure_process_group, resolve_device
from unirl.train.backends.megatron import bridge as hf_bridge
from unirl.train.backends.megatron.config import MegatronConfig
from unirl.train.backends.megatron.model import MegatronCausalLM
from unirl.train.ema import swapped_weights

_MOMENTS = ("exp_avg", "exp_avg_sq")


class MegatronBackend(OptimizedBackend):
    """Owns a megatron-core GPTModel, its optimizer, LR schedule, EMA, reference and rollout copy."""

    def __init__(
        self, module: torch.nn.Module, config: MegatronConfig, device: torch.device | str | None = None
    ) -> None:
        self.config = config
        self.device = resolve_device(device)
        ensure_process_group(self.device)
        if self.device.type == "cpu":
            from unirl.train.backends.megatron import cpu

            cpu.install()
        self._init_parallel_state(config)
        hf_config = getattr(module, "config", None)
        if hf_config is None or not hasattr(hf_config, "model_type"):
            raise ValueError(
                f"backend.kind=megatron needs a Hugging Face causal LM (a module with .config); "
                f"got {type(module).__name__}"
            )
        self.bridge = hf_bridge.make_bridge(
            hf_config,
            local_spec=self._local_spec(config),
            overrides=self._overrides(config),
            sdpa_attention=config.attention == "sdpa",
        )
        gpt = hf_bridge.build_gpt_model(self.bridge).to(self.device)
        hf_bridge.load_hf_weights(self.bridge, gpt, dict(module.state_dict()))
        param_dtype, _ = config.precision.resolve(self.device)
        embed = module.get_input_embeddings() if hasattr(module, "get_input_embeddings") else None
        self.module = MegatronCausalLM(gpt, hf_config, param_dtype, getattr(embed, "padding_idx", None))
        self.gpt = gpt
        module.requires_grad_(False)
        self.rollout_module = module
        self._tied = _tied_aliases(module)  # e.g. lm_head.weight -> model.embed_tokens.weight
        self._hf_keys = set(module.state_dict()) - set(self._tied)  # each tensor once
        self._rollout_version = 0  # the rollout copy holds the weights of this optimizer step
        trainable = {n: p for n, p in self.module.named_parameters() if p.requires_grad}
        self._init_optimization(
            trainable, config.optimizer, config.scheduler, config.ema, config.reference == "frozen_copy"
        )

    # -- construction -----------------------------------------------------------------------
    def _init_parallel_state(self, config: MegatronConfig) -> None:
        from megatron.core import parallel_state as mpu
        from megatron.core import tensor_parallel

        tp = config.tensor_model_parallel_size
        world = dist.get_world_size()
        if world % tp:
            raise ValueError(
                f"backend.tensor_model_parallel_size={tp} does not divide the world size {world}; "
                f"use a divisor of {world}"
            )
        if not mpu.model_parallel_is_initialized():
            mpu.initialize_model_parallel(tensor_model_parallel_size=tp)
        elif mpu.get_tensor_model_parallel_world_size() != tp:
            raise ValueError(
                f"megatron-core is already initialised with TP={mpu.get_tensor_model_parallel_world_size()} "
                f"in this process, but backend.tensor_model_parallel_size={tp}"
            )
        if self.device.type == "cuda":
            tensor_parallel.model_parallel_cuda_manual_seed(int(torch.initial_seed() % 2**31))

    @staticmethod
    def _local_spec(config: MegatronConfig) -> bool:
        has_te = hf_bridge.has_transformer_engine()
        if config.transformer_impl == "transformer_engine" and not has_te:
            raise ValueError(
                "backend.transformer_impl='transformer_engine' but transformer_engine is not installed; "
                "install it or use transformer_impl: local"
            )
        local = config.transformer_impl == "local" or not has_te
        if local and config.sequence_parallel:
            raise ValueError(
                "backend.sequence_parallel=True needs Transformer Engine's norms (megatron-core's local "
                "layer spec has none that shard the sequence); install transformer_engine or set "
                "sequence_parallel: false"
            )
        return local

    def _overrides(self, config: MegatronConfig) -> dict[str, Any]:
        """TransformerConfig fields set here: the parallel layout, recompute, and the fused CUDA
        kernels off where they need apex/TE."""
        out: dict[str, Any] = {
            # megatron-core marks the tensor-parallel weights (tensor_model_parallel, partition_dim)
            # only in its initialisation; the bridge's TP gather needs the marks
            "use_cpu_initialization": self.device.type == "cpu",
            "perform_initialization": True,
            "sequence_parallel": config.sequence_parallel,
            "masked_softmax_fusion": False,
            "gradient_accumulation_fusion": False,
            "bias_activation_fusion": False,
            "apply_rope_fusion": False,
        }
        if config.recompute != "none":
            out["recompute_granularity"] = config.recompute
            if config.recompute == "full":
                out |= {"recompute_method": "uniform", "recompute_num_layers": 1}
        return out

    # -- identity ---------------------------------------------------------------------------
    @property
    def tp_size(self) -> int:
        from megatron.core import parallel_state as mpu

        return mpu.get_tensor_model_parallel_world_size()

    # -- training ---------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, *, last_micro_batch: bool = True) -> None:
        """Accumulate the gradient of `loss` (gradients are reduced once, in `step`)."""
        loss.backward()

    def _reduce_grads(self) -> None:
        from megatron.core import parallel_state as mpu

        grads = [p.grad for p in self.trainable.values() if p.grad is not None]
        if mpu.get_data_parallel_world_size() > 1:
            _all_reduce_flat(grads, mpu.get_data_parallel_group())
        if self.tp_size > 1:  # what megatron-core's finalize_model_grads does over the TP group
            summed, averaged = self._tp_partial_grads()
            _all_reduce_flat(summed, mpu.get_tensor_model_parallel_group())
            _all_reduce_flat(averaged, mpu.get_tensor_model_parallel_group(), op=dist.ReduceOp.AVG)

    def _tp_partial_grads(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Gradients of replicated weights that each TP rank holds only a part of: summed are the
        sequence-parallel norms' and the per-head QK norms' (each rank sees its own heads' or
        tokens' share), averaged are those megatron-core marks ``average_gradients_across_tp_domain``."""
        qk = bool(getattr(self.gpt.config, "qk_layernorm", False))
        summed, averaged = [], []
        for name, p in self.trainable.items():
            if p.grad is None:
                continue
            if getattr(p, "average_gradients_across_tp_domain", False):
                averaged.append(p.grad)
            elif (self.config.sequence_parallel and getattr(p, "sequence_parallel", False)) or (
                qk and ("q_layernorm" in name or "k_layernorm" in name)
            ):
                summed.append(p.grad)
        return summed, averaged

    def _total_grad_norm(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        if self.tp_size == 1:
            return super()._total_grad_norm(params)
        from megatron.core import parallel_state as mpu

        split = [p.grad for p in params if getattr(p, "tensor_model_parallel", False)]
        replicated = [p.grad for p in params if not getattr(p, "tensor_model_parallel", False)]
        norm = torch.nn.utils.get_total_norm
        sq = (
            norm(split, error_if_nonfinite=False).float() ** 2
            if split
            else torch.zeros((), device=self.device)
        )
        dist.all_reduce(sq, group=mpu.get_tensor_model_parallel_group())
        if replicated:
            sq = sq + norm(replicated, error_if_nonfinite=False).float() ** 2
        return sq.sqrt()

    def all_reduce(self, values: Sequence[float], op: Literal["sum", "max"] = "sum") -> list[float]:
        """Sum or max of a few scalars over the data-parallel ranks (fp64)."""
        from megatron.core import parallel_state as mpu

        t = torch.tensor(list(values), dtype=torch.float64)
        if mpu.get_data_parallel_world_size() > 1:
            t = t.to(self.device)
            reduce_op = dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX
            dist.all_reduce(t, op=reduce_op, group=mpu.get_data_parallel_group())
        return t.cpu().tolist()

    # -- weight views -----------------------------------------------------------------------
    def reference_weights(self) -> AbstractContextManager[None]:
        """Context in which `module` is the frozen reference policy (for KL terms)."""
        return self._frozen_copy_weights()

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Context for trainside sampling: the rollout copy (the Hugging Face module) holds the
        trained weights inside (loaded when it is behind: after an optimizer step or a load)."""
        self.sync_rollout()
        yield

    def sync_rollout(self) -> None:
        """Load the trained weights into the rollout copy if it is behind (collective over TP),
        streamed one weight at a time (no full second copy of the model)."""
        if self._rollout_version == self._step:
            return
        params = dict(self.rollout_module.named_parameters())  # a tied weight once
        missing = set(params)
        with torch.no_grad():
            for name, value in self.named_hf_weights():
                params[name].copy_(value)
                missing.discard(name)
        if missing:
            raise RuntimeError(f"megatron export lacks rollout-copy weights, e.g. {sorted(missing)[:3]}")
        self._rollout_version = self._step

    def named_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """`(Hugging Face name, CPU tensor)` of each weight, TP-gathered one at a time (a tied
        weight once): what a weight plane streams without a full copy (collective: every TP rank
        iterates in step)."""
        return hf_bridge.iter_hf_weights(self.bridge, self.gpt)

    def full_state_dict(self, merge_lora: bool = True) -> dict[str, torch.Tensor]:
        """Every weight under its Hugging Face name, TP-gathered, on CPU (collective; every rank
        gets the full dict). The keys are the Hugging Face module's state-dict keys: a tied weight
        (``lm_head.weight``) appears under both names, as one tensor."""
        out = dict(self.named_hf_weights())
        for alias, original in self._tied.items():
            out.setdefault(alias, out[original])
        return out

    # -- checkpoint state -------------------------------------------------------------------
    def _to_hf(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Tensors shaped like the trainable parameters (keyed by their names here) under the Hugging
        Face names (a tied weight once), TP-gathered: swapped into the parameters and exported
        (collective)."""
        if not values:
            return {}
        with swapped_weights(self.trainable, values):
            return dict(self.named_hf_weights())

    def _from_hf(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The inverse of `_to_hf`: this rank's TP shard of each, keyed by parameter name."""
        with torch.no_grad():
            backup = {n: p.detach().clone() for n, p in self.trainable.items()}
            hf_bridge.load_hf_weights(self.bridge, self.gpt, values)
            out = {n: p.detach().clone() for n, p in self.trainable.items()}
            for n, p in self.trainable.items():
                p.copy_(backup[n])
        return out

    def state_dict(self) -> dict[str, Any]:
        """Weights, AdamW moments, EMA and reference under Hugging Face names (TP-gathered, CPU),
        per-parameter AdamW step counts, scheduler and step (collective). Every trainable weight
        has its moments (zeros and step 0 before the first step), so the tree has one shape."""
        names = list(self.trainable)
        opt = self.optimizer.state_dict()
        per_param = {names[i]: s for i, s in opt["state"].items()}
        for n, p in self.trainable.items():  # before the first step: AdamW's own initial state
            if n not in per_param:
                zero = torch.zeros_like(p, memory_format=torch.preserve_format)
                per_param[n] = {"step": torch.tensor(0.0), "exp_avg": zero, "exp_avg_sq": zero.clone()}
        state: dict[str, Any] = {
            "model": dict(self.named_hf_weights()),
            "optimizer": {
                "step": {n: s["step"].detach().cpu().clone() for n, s in per_param.items()},
                **{k: self._to_hf({n: s[k] for n, s in per_param.items()}) for k in _MOMENTS},
                "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in opt["param_groups"]],
            },
            "scheduler": self.scheduler.state_dict(),
            "ema": self._to_hf(self.ema.shadow) if self.ema else {},
            "global_step": self._step,
            "ema_start": self._ema_start,
        }
        if self._reference is not None:
            state["reference"] = self._to_hf(self._reference)
        return state

    def sharded_state_dict(self) -> dict[str, Any]:
        """The state the `sharded` checkpoint format writes: `state_dict()`, Hugging Face-named and
        TP-gathered, so a run at another TP size or world size resumes from it. Its tensors are
        plain (not DTensors): the format writes them once, from rank 0, as safetensors (collective)."""
        return self.state_dict()

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `sharded_state_dict()` output read by the sharded checkpoint format."""
        self.load_state_dict(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output (written at any tensor-parallel size)."""
        expected = self._hf_keys
        got = set(state["model"])
        if got != expected:
            raise ValueError(
                f"checkpoint model state does not match this model: missing {sorted(expected - got)[:3]}, "
                f"unexpected {sorted(got - expected)[:3]} (same model config?)"
            )
        weights = self._from_hf(state["model"])
        with torch.no_grad():
            for n, p in self.trainable.items():
                p.copy_(weights[n])
        o = state["optimizer"]
        moments = {k: self._from_hf(o[k]) if o[k] else {} for k in _MOMENTS}
        names = list(self.trainable)
        per_param = {
            i: {"step": o["step"][n], **{k: moments[k][n] for k in _MOMENTS}}
            for i, n in enumerate(names)
            if n in o["step"]
        }
        groups = [{**g, "params": list(range(len(names)))} for g in o["param_groups"]]
        self.optimizer.load_state_dict({"state": per_param, "param_groups": groups})
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(self._from_hf(state["ema"]))
        if self._reference is not None and "reference" in state:
            ref = self._from_hf(state["reference"])
            with torch.no_grad():
                for n, r in self._reference.items():
                    r.copy_(ref[n])
        self._step = int(state["global_step"])
        self._ema_start = int(state.get("ema_start", 0))
        self._rollout_version = -1  # the rollout copy is behind whatever was loaded


def _all_reduce_flat(grads: list[torch.Tensor], group: Any, op: Any = dist.ReduceOp.SUM) -> None:
    """Reduce `grads` over `group` in place (sum by default), as one flat buffer per dtype."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = _flatten_dense_tensors(same)
        dist.all_reduce(flat, op=op, group=group)
        for g, reduced in zip(same, _unflatten_dense_tensors(flat, same)):
            g.copy_(reduced)


def _tied_aliases(module: torch.nn.Module) -> dict[str, str]:
    """Each parameter name that shares its tensor with an earlier name -> that earlier name
    (e.g. a tied ``lm_head.weight`` -> ``model.embed_tokens.weight``)."""
    seen: dict[int, str] = {}
    aliases = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases[name] = seen[id(p)]
        else:
            seen[id(p)] = name
    return aliases
