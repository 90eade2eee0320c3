"""Gradient reduction and the total gradient norm of `MegatronBackend` over the DP, TP and PP
groups: what megatron-core's `finalize_model_grads` and `get_grad_norm_fp32` do, for the plain
``.grad`` tensors the backend's torch AdamW steps.

- data parallel: gradients summed (losses are divided by global, rank-summed BatchTotals);
- tensor parallel: the replicated weights whose gradient each TP rank holds only a part of (the
  per-head QK norms, and the norms under sequence parallelism) summed over the TP ranks, those
  megatron-core marks ``average_gradients_across_tp_domain`` averaged;
- pipeline parallel: a tied output layer (``share_embeddings_and_output_weights``) has a copy
  on the last stage; the gradients of the two copies are summed over the embedding group (first
  and last stage), so both take the same step and stay equal;
- norm: TP-split gradients' squares summed over the TP ranks, replicated ones counted once,
  then summed over the pipeline stages; the last stage's copy of a tied weight (megatron-core
  marks it ``shared``) is left out, so every weight counts once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist


def reduce_grads(
    trainable: Mapping[str, torch.nn.Parameter],
    chunks: Sequence[Any],
    *,
    sequence_parallel: bool,
    qk: bool,
) -> None:
    """Make this rank's gradients the globally reduced ones (collective over DP, TP, embedding);
    ``qk``: the model has per-head QK norms (named ``*q_layernorm`` / ``*k_layernorm``)."""
    from megatron.core import parallel_state as mpu

    grads = [p.grad for p in trainable.values() if p.grad is not None]
    if mpu.get_data_parallel_world_size() > 1:
        all_reduce_flat(grads, mpu.get_data_parallel_group())
    if mpu.get_tensor_model_parallel_world_size() > 1:
        summed, averaged = tp_partial_grads(trainable, sequence_parallel=sequence_parallel, qk=qk)
        all_reduce_flat(summed, mpu.get_tensor_model_parallel_group())
        all_reduce_flat(averaged, mpu.get_tensor_model_parallel_group(), op=dist.ReduceOp.AVG)
    tied = tied_embedding_copy(chunks)
    if tied is not None:
        if tied.grad is None:
            tied.grad = torch.zeros_like(tied)
        dist.all_reduce(tied.grad, group=mpu.get_embedding_group())


def tied_embedding_copy(chunks: Sequence[Any]) -> torch.nn.Parameter | None:
    """This rank's copy of a tied embedding / output weight when the two live on different pipeline
    stages (the first stage's embedding, or the last stage's output layer); else None."""
    from megatron.core import parallel_state as mpu

    if mpu.get_pipeline_model_parallel_world_size() == 1 or not mpu.is_rank_in_embedding_group():
        return None
    first, last = chunks[0], chunks[-1]
    if first.pre_process and first.share_embeddings_and_output_weights:
        return first.shared_embedding_or_output_weight()
    if last.post_process and last.share_embeddings_and_output_weights:
        return last.shared_embedding_or_output_weight()
    return None


def tp_partial_grads(
    trainable: Mapping[str, torch.nn.Parameter], *, sequence_parallel: bool, qk: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Gradients of replicated weights that each TP rank holds only a part of: summed are the
    sequence-parallel norms' and the per-head QK norms' (each rank sees its own heads' or
    tokens' share), averaged are those megatron-core marks ``average_gradients_across_tp_domain``."""
    summed, averaged = [], []
    for name, p in trainable.items():
        if p.grad is None:
            continue
        if getattr(p, "average_gradients_across_tp_domain", False):
            averaged.append(p.grad)
        elif (sequence_parallel and getattr(p, "sequence_parallel", False)) or (
            qk and ("q_layernorm" in name or "k_layernorm" in name)
        ):
            summed.append(p.grad)
    return summed, averaged


def total_grad_norm(params: Sequence[torch.nn.Parameter], device: torch.device) -> torch.Tensor:
    """The L2 norm of all gradients of the model over the TP and PP ranks (collective; non-finite
    allowed)."""
    from megatron.core import parallel_state as mpu

    params = [p for p in params if not getattr(p, "shared", False)]  # a tied weight's 2nd copy
    split = [p.grad for p in params if getattr(p, "tensor_model_parallel", False)]
    replicated = [p.grad for p in params if not getattr(p, "tensor_model_parallel", False)]
    sq = _sq_norm(split, device)
    if mpu.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(sq, group=mpu.get_tensor_model_parallel_group())
    sq = sq + _sq_norm(replicated, device)
    if mpu.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(sq, group=mpu.get_pipeline_model_parallel_group())
    return sq.sqrt()


def _sq_norm(grads: list[Any], device: torch.device) -> torch.Tensor:
    if not grads:
        return torch.zeros((), device=device)
    return torch.nn.utils.get_total_norm(grads, error_if_nonfinite=False).float() ** 2


def all_reduce_flat(grads: list[torch.Tensor], group: Any, op: Any = dist.ReduceOp.SUM) -> None:
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
