"""MegatronBackend: a Hugging Face causal LM trained as a megatron-core GPTModel.

Built once, in this order: process group -> megatron-core parallel state (TP groups inside the
world, then PP stages; the rest of the world is data parallel) -> mbridge bridge for the model's
family -> the GPTModel chunks of this rank (its pipeline stage, or one chunk per virtual stage;
local or Transformer Engine layer spec) -> the Hugging Face weights split into them -> AdamW + schedule + EMA + frozen reference over its parameters (the same optimizer
code as FSDPBackend, so the two backends take the same step from the same gradient).

`module` is the GPTModel behind the Hugging Face forward the pipelines call (`MegatronCausalLM`):
the replay and every loss run through megatron-core. The Hugging Face module the backend was
built from stays as the rollout copy: `gathered()` (the trainside sampling context) first loads
the trained weights into it when it is behind, so KV-cached decode runs on Hugging Face code.

Training: TrainStack hands the micro-batches of an optimizer step to `run_micro_batches`, which
runs them through megatron-core's forward-backward schedule (`schedule.py`; 1F1B across the
pipeline stages at PP > 1). Gradients are reduced over the DP, TP and embedding groups and their
norm over TP and PP as megatron-core's finalize_model_grads does (`grads.py`).

Checkpoint state is Hugging Face-named, TP-gathered and collected over the pipeline stages
(weights, AdamW moments, EMA, reference; per-parameter step counts under global megatron names),
so it loads at any tensor- or pipeline-parallel size; the `sharded` checkpoint format writes it as safetensors
(no pickle) and resumes at another world size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal

import torch
import torch.distributed as dist

from unirl.train.backends.common import OptimizedBackend
from unirl.train.backends.dist import ensure_process_group, resolve_device
from unirl.train.backends.megatron import bridge as hf_bridge
from unirl.train.backends.megatron import grads, layout, schedule
from unirl.train.backends.megatron.config import MegatronConfig
from unirl.train.backends.megatron.model import MegatronCausalLM
from unirl.train.ema import swapped_weights

_MOMENTS = ("exp_avg", "exp_avg_sq")


class MegatronBase(OptimizedBackend):
    """What the megatron-core models of the backend share: the parallel state, gradient reduction
    and norm over DP / TP / PP, and the state, weights and checkpoints under the source model's
    (Hugging Face or diffusers) names through a bridge (mbridge's interface: ``load_weights``,
    ``export_weights``). A subclass builds the model (`_build`)."""

    bridge: Any
    chunks: list[torch.nn.Module]
    _tied: dict[str, str]  # a tied weight's second name -> its first
    _hf_keys: set[str]  # the source model's weight names (each tensor once)
    _global_names: dict[str, str]  # trainable name -> its name in the whole, unsplit model
    _qk_layernorm: bool  # per-head QK norms (their gradients are partial per TP rank)
    _rollout_version: int

    def __init__(
        self, module: torch.nn.Module, config: MegatronConfig, device: torch.device | str | None = None
    ) -> None:
        self.config = config
        self.device = resolve_device(device)
        ensure_process_group(self.device)
        if self.device.type == "cpu":
            from unirl.train.backends.megatron import cpu

            cpu.install()
        self._check_config(config)
        layout.init_parallel_state(config, self.device)
        trainable = self._build(module, config)
        self._init_optimization(
            trainable, config.optimizer, config.scheduler, config.ema, config.reference == "frozen_copy"
        )

    def _check_config(self, config: MegatronConfig) -> None:
        """Refuse what this model does not run, before the parallel state is set up (none here)."""

    def _build(self, module: torch.nn.Module, config: MegatronConfig) -> dict[str, torch.nn.Parameter]:
        """Build `module` (the model on megatron-core), `chunks`, `bridge` and the weight-name
        maps from the given model; return the trainable parameters by name."""
        raise NotImplementedError

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
            # the schedule's loss function returns (loss, 1, record): megatron-core then neither
            # divides by the micro-batch count nor by a token count (schedule.py)
            "calculate_per_token_loss": True,
            "variable_seq_lengths": True,  # each micro-batch packed to its own length
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

    @property
    def pp_size(self) -> int:
        from megatron.core import parallel_state as mpu

        return mpu.get_pipeline_model_parallel_world_size()

    # -- training ---------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, *, last_micro_batch: bool = True) -> None:
        """Accumulate the gradient of `loss` (gradients are reduced once, in `step`); at
        pipeline_model_parallel_size > 1 only `run_micro_batches` trains."""
        if self.pp_size > 1:
            raise RuntimeError(
                "backend.pipeline_model_parallel_size > 1 trains through backend.run_micro_batches "
                "(megatron-core's schedule), not backward(); an algorithm that streams its backward "
                "needs pipeline_model_parallel_size: 1"
            )
        loss.backward()

    def _reduce_grads(self) -> None:
        grads.reduce_grads(
            self.trainable,
            self.chunks,
            sequence_parallel=self.config.sequence_parallel,
            qk=self._qk_layernorm,
        )

    def _total_grad_norm(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        if self.tp_size == 1 and self.pp_size == 1:
            return super()._total_grad_norm(params)
        return grads.total_grad_norm(params, self.device)

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

    def hf_param_names(self) -> list[str]:
        """The source model's parameter names, in its order (what a rollout copy holds)."""
        raise NotImplementedError

    def named_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """`(Hugging Face name, CPU tensor)` of each weight, TP-gathered and broadcast over the
        pipeline stages one at a time (a tied weight once): what a weight plane streams without a
        full copy (collective: every rank iterates in step and gets every weight)."""
        return hf_bridge.iter_hf_weights(self.bridge, self.chunks, skip=self._tied)

    def full_state_dict(self, merge_lora: bool = True) -> dict[str, torch.Tensor]:
        """Every weight under its Hugging Face name, TP-gathered and collected over the pipeline
        stages, on CPU (collective; every rank gets the full dict). The keys are the Hugging Face module's state-dict keys: a tied weight
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
        # a tied output layer's copy on the last stage loads from the embedding's entry
        values = {**{a: values[o] for a, o in self._tied.items() if o in values}, **values}
        with torch.no_grad():
            backup = {n: p.detach().clone() for n, p in self.trainable.items()}
            hf_bridge.load_hf_weights(self.bridge, self.chunks, values)
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
                "step": layout.gather_steps(
                    {self._global_names[n]: s["step"].detach().cpu().clone() for n, s in per_param.items()}
                ),
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
        steps = o["step"]
        per_param = {
            i: {"step": steps[self._global_names[n]], **{k: moments[k][n] for k in _MOMENTS}}
            for i, n in enumerate(names)
            if self._global_names[n] in steps
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


class MegatronBackend(MegatronBase):
    """Owns a megatron-core GPTModel, its optimizer, LR schedule, EMA, reference and rollout copy."""

    def _build(self, module: torch.nn.Module, config: MegatronConfig) -> dict[str, torch.nn.Parameter]:
        hf_config = getattr(module, "config", None)
        if hf_config is None or not hasattr(hf_config, "model_type"):
            raise ValueError(
                f"backend.kind=megatron needs a Hugging Face causal LM (a module with .config); "
                f"got {type(module).__name__}"
            )
        layout.check_layers(config, hf_config)
        self.bridge = hf_bridge.make_bridge(
            hf_config,
            local_spec=self._local_spec(config),
            overrides=self._overrides(config),
            sdpa_attention=config.attention == "sdpa",
        )
        chunks = hf_bridge.build_gpt_models(self.bridge, self.device)
        hf_bridge.load_hf_weights(self.bridge, chunks, dict(module.state_dict()))
        param_dtype, _ = config.precision.resolve(self.device)
        embed = module.get_input_embeddings() if hasattr(module, "get_input_embeddings") else None
        pad = getattr(embed, "padding_idx", None)
        self.module = MegatronCausalLM(chunks[0], hf_config, param_dtype, pad, vp_chunks=chunks[1:])
        self.gpt = chunks[0]  # this rank's (first) model chunk
        self.chunks = chunks
        if self.pp_size > 1:
            self.module.pipelined_forward = schedule.pipelined_forward(self.module, self.device)
        module.requires_grad_(False)
        self.rollout_module = module
        self._tied = _tied_aliases(module)  # e.g. lm_head.weight -> model.embed_tokens.weight
        self._hf_keys = set(module.state_dict()) - set(self._tied)  # each tensor once
        self._rollout_version = 0  # the rollout copy holds the weights of this optimizer step
        self._qk_layernorm = bool(getattr(self.gpt.config, "qk_layernorm", False))
        trainable = {n: p for n, p in self.module.named_parameters() if p.requires_grad}
        self._global_names = layout.global_param_names(self.bridge, chunks)
        return trainable

    # -- construction -----------------------------------------------------------------------
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

    # -- training ---------------------------------------------------------------------------
    def run_micro_batches(
        self, micro: Sequence[Any], loss_fn: Callable[[Any], tuple[torch.Tensor, dict[str, float]]]
    ) -> list[tuple[float, dict[str, float]]]:
        """Forward and backward of each micro-batch through megatron-core's schedule, `loss_fn`
        (already globally normalised) on the last pipeline stage; each micro-batch's
        ``(loss value, metrics)`` on every rank (collective over the pipeline group)."""
        return schedule.run_micro_batches(self.module, micro, loss_fn, self.device)

    # -- the rollout copy ---------------------------------------------------------------------
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

    def hf_param_names(self) -> list[str]:
        return [n for n, _ in self.rollout_module.named_parameters()]


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
