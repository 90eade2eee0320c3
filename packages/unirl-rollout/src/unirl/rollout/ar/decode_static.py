"""The static-shape decode loop: a pre-allocated KV cache and one fixed-shape step, replayable
as a CUDA graph.

Batch-64 decoding of a small model is launch-bound: each token costs hundreds of small kernel
launches and some Python per layer, far more than its arithmetic. This loop keeps every shape
fixed for the whole call, so the decode step (model forward at one position, the token draw,
and the bookkeeping of tokens / log-probs / lengths / finished flags) can be captured once as a
``torch.cuda.CUDAGraph`` and replayed per token with a single launch.

It follows ``decode``'s semantics exactly: the same left-padded prefill, the same per-row
uniforms, the same sampling function and log-prob convention, the same stop rules; the two
loops agree token for token in fp32 (tests/test_ar_decode_static.py). What makes the step
static:

- ``transformers.StaticCache`` (cache length ``P + N``) advances its own device-side length, so
  the captured step writes each token's keys and values at the right slot.
- The 4D attention mask ``[B, 1, 1, P + N]`` is built inside the step from the step index held
  in a device tensor (keys up to the current position, minus each row's left padding) and
  passed to the model as a prepared mask, so no host-side mask logic runs per token.
- The step index, the uniforms of that step and the fed-back token live in device buffers that
  the host updates in place before each replay.
- Attention can read only the filled part of the cache, rounded up to a bucket of ``kv_bucket``
  slots (one graph per bucket; the slots cut off are masked anyway, so results do not change),
  and a one-token query of a grouped-query model attends as ``[B, kv_heads, q_per_kv, D]``
  against the un-repeated keys and values (transformers' SDPA path copies every KV head
  ``q_per_kv`` times per layer and step when a mask is given).

The host still syncs every ``sync_every`` steps (all rows finished? stop strings?), never per
token. Without CUDA (or with ``graph=False``) the same step runs eagerly, which is how CPU tests
exercise every line but the capture.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers import StaticCache

from unirl.rollout.ar.decode import (
    DecodeOutput,
    DecodeState,
    cache_kwarg,
    left_pad,
    prefill,
    record_step,
    stop_tensors,
)
from unirl.rollout.ar.fused_decode import FusedLM, require_gathered

__all__ = ["decode_static"]

ATTENTION = "unirl_static_decode"
_KV_LEN: list[int] = [0]  # the cache slots attention reads in the step being built (a bucket)


def _decode_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """Attention of one new token over the first ``_KV_LEN[0]`` cache slots, grouped-query aware.

    ``query [B, H, 1, D]`` is viewed as ``[B, KV, H / KV, D]`` (query head h uses KV head
    h // (H / KV), as ``repeat_kv`` pairs them), so no KV head is copied. Returns ``[B, 1, H, D]``.
    """
    B, H, q_len, D = query.shape
    kv_heads, n = key.shape[1], _KV_LEN[0] or key.shape[2]
    if q_len != 1 or H % kv_heads:
        raise ValueError(
            f"{ATTENTION} handles one-token decode steps only; got q_len={q_len}, heads={H}/{kv_heads}"
        )
    mask = None if attention_mask is None else attention_mask[..., :n]
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(B, kv_heads, H // kv_heads, D), key[:, :, :n], value[:, :, :n],
        attn_mask=mask, dropout_p=0.0, scale=scaling,
    )  # fmt: skip
    return out.reshape(B, H, 1, D).transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _decode_attention)


@torch.no_grad()
def decode_static(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    uniforms_BN: Tensor,
    limits: Sequence[int],
    temperature: float,
    top_k: int,
    top_p: float,
    stop_token_ids: Sequence[int],
    pad_token_id: int,
    stop_check: Callable[[list[int]], bool] | None = None,
    sync_every: int = 16,
    graph: bool = True,
    pad_prompt_to: int = 1,
    kv_bucket: int = 0,
    compile: bool = False,
    fused: bool = False,
) -> DecodeOutput:
    """``decode`` with a static KV cache; on CUDA with ``graph`` the step is a replayed CUDA graph.

    Args are ``decode``'s, plus ``graph`` (capture the step; ignored off CUDA),
    ``pad_prompt_to`` (left-pad the prompt block to a multiple of this, so calls with slightly
    different prompt lengths share cache shapes) and ``kv_bucket`` (attention reads the filled
    cache rounded up to a multiple of this, one graph per bucket; 0 reads all of it with one
    graph, which measured fastest on an H200 because every call captures its graphs anew) and
    ``compile`` (run the step through ``torch.compile``: one whole-model graph with the cache
    writes, attention, sampling and bookkeeping fused into few kernels; needs ``kv_bucket=0``,
    since each bucket length would be a recompile. Compiled once per process and shape; later
    calls with the same batch size and cache length reuse it) and ``fused`` (the step runs
    ``FusedLM``'s forward instead of the model's: concatenated q/k/v and gate/up GEMMs, direct
    cache writes, and on CUDA flex attention reading only the cache blocks filled so far;
    Llama-family models only, see ``fused_decode.fusable``). Not
    for sharded (FSDP lockstep) sampling: use ``decode`` there. Not thread-safe: one call at a
    time per process (the bucket length is module state read while the step is built).
    """
    if compile and kv_bucket:
        raise ValueError(
            f"decode_static(compile=True, kv_bucket={kv_bucket}): each bucket length would compile "
            "its own graph; use kv_bucket=0 with compile"
        )
    device = next(model.parameters()).device
    B, N = len(prompts), max(limits)
    ids_BP, mask_BP = _padded_prompts(prompts, pad_token_id, device, pad_prompt_to)
    P = ids_BP.shape[1]
    L = P + N
    u_BN = uniforms_BN.to(device, torch.float32)[:, :N].contiguous()
    limits_B, stop_ids, pad = stop_tensors(limits, stop_token_ids, pad_token_id, device)

    kw = cache_kwarg(model)
    _check_model(model)
    cache = StaticCache(config=model.config, max_cache_len=L)
    st = DecodeState(B, N, device, pad_token_id)
    sample = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    logits_BV = prefill(model, ids_BP, mask_BP, kw, cache)
    record_step(st, logits_BV, u_BN, limits_B, stop_ids, pad, **sample)  # step 0

    io = _StepIO.of(st, mask_BP, N, u_BN, limits_B, stop_ids, pad)
    step = _bound_step(model, cache, kw, io, sample, fused=fused, compile=compile)
    runner = _bucket_runners(step, st, cache, use_graph=graph and device.type == "cuda")
    _register_attention()
    saved_impl, model.config._attn_implementation = model.config._attn_implementation, ATTENTION
    steps = 1
    unhooked = _fsdp_hooks_detached(model) if compile and not fused else contextlib.nullcontext()
    try:
        with unhooked:
            for t in range(1, N):
                if steps % sync_every == 0 and st.sync_finished(steps, stop_check):
                    break
                st.t.fill_(t)
                runner(min(L, -(-(P + t) // kv_bucket) * kv_bucket) if kv_bucket > 0 else L)()
                steps = t + 1
    finally:
        model.config._attn_implementation = saved_impl
        _KV_LEN[0] = 0
    return st.output(steps)


def _padded_prompts(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device, pad_prompt_to: int
) -> tuple[Tensor, Tensor]:
    """``left_pad``, with the prompt block further left-padded to a multiple of ``pad_prompt_to``."""
    ids_BP, mask_BP = left_pad(prompts, pad_token_id, device)
    extra = (-ids_BP.shape[1]) % pad_prompt_to
    if extra:
        ids_BP = torch.nn.functional.pad(ids_BP, (extra, 0), value=pad_token_id)
        mask_BP = torch.nn.functional.pad(mask_BP, (extra, 0), value=0)
    return ids_BP, mask_BP


def _bound_step(
    model: nn.Module,
    cache: StaticCache,
    kw: str,
    io: _StepIO,
    sample: dict[str, Any],
    *,
    fused: bool,
    compile: bool,
) -> Callable[[], None]:
    """The static step with all its inputs bound: ``_step`` or ``_fused_step``, maybe compiled."""
    if fused:
        fn: Callable[..., None] = _fused_step
        head: tuple[Any, ...] = (
            FusedLM.of(model),
            [x.keys for x in cache.layers],
            [x.values for x in cache.layers],
        )
    else:
        fn, head = _step, (model, cache, kw)
    step_fn = _compiled(fn) if compile else fn
    args = (*head, io)

    def step() -> None:
        step_fn(*args, **sample)

    return step


def _bucket_runners(
    step: Callable[[], None], st: DecodeState, cache: StaticCache, *, use_graph: bool
) -> Callable[[int], Callable[[], None]]:
    """``runner(kv_len)``: the step reading ``kv_len`` cache slots, captured as a CUDA graph
    once per bucket (``use_graph``; all buckets share one memory pool), or eager."""
    runs: dict[int, Callable[[], None]] = {}
    pool = torch.cuda.graph_pool_handle() if use_graph else None

    def runner(kv_len: int) -> Callable[[], None]:
        if kv_len not in runs:

            def bucket_step() -> None:
                _KV_LEN[0] = kv_len
                step()

            runs[kv_len] = _capture(bucket_step, st, cache, pool) if use_graph else bucket_step
        return runs[kv_len]

    return runner


@dataclass
class _StepIO:
    """What every static step reads besides the model: the decode state, each row's kept prompt
    slots, the prompt block length and the sampling inputs (all fixed-address device tensors)."""

    st: DecodeState
    keep_L: Tensor
    kv_idx_L: Tensor
    P: int
    pos_B: Tensor
    u_BN: Tensor
    limits_B: Tensor
    stop_ids: Tensor
    pad: Tensor

    @classmethod
    def of(
        cls,
        st: DecodeState,
        mask_BP: Tensor,
        N: int,
        u_BN: Tensor,
        limits_B: Tensor,
        stop_ids: Tensor,
        pad: Tensor,
    ) -> _StepIO:
        """The step inputs of a prompt block with mask ``mask_BP`` followed by ``N`` response slots."""
        B, P = mask_BP.shape
        device = mask_BP.device
        keep_L = torch.cat([mask_BP.bool(), torch.ones(B, N, dtype=torch.bool, device=device)], dim=1)
        kv_idx_L = torch.arange(P + N, device=device)
        pos_B = mask_BP.sum(-1)  # position id of the first response token
        return cls(st, keep_L, kv_idx_L, P, pos_B, u_BN, limits_B, stop_ids, pad)

    def attend(self) -> tuple[Tensor, Tensor]:
        """``(prev, mask_BL)``: token t-1 sits at cache slot ``P + prev``; ``mask_BL`` keeps the
        slots up to it, minus each row's left padding."""
        prev = self.st.t - 1
        return prev, self.keep_L & (self.kv_idx_L <= self.P + prev)

    def record(self, logits_BV: Tensor, **sample: Any) -> None:
        record_step(self.st, logits_BV, self.u_BN, self.limits_B, self.stop_ids, self.pad, **sample)


def _step(model: nn.Module, cache: StaticCache, kw: str, io: _StepIO, **sample: Any) -> None:
    """Feed token t-1 (at cache slot P + t - 1), sample token t: the whole static step."""
    prev, mask_BL = io.attend()
    logits = model(
        input_ids=io.st.tok_B1, attention_mask={"full_attention": mask_BL[:, None, None, :]},
        position_ids=(io.pos_B + prev)[:, None], use_cache=True, **{kw: cache},
    ).logits[:, -1]  # fmt: skip
    io.record(logits, **sample)


def _fused_step(lm: FusedLM, keys: list[Tensor], values: list[Tensor], io: _StepIO, **sample: Any) -> None:
    """``_step`` with ``FusedLM``'s forward, writing the StaticCache's tensors directly."""
    prev, mask_BL = io.attend()
    io.record(lm.step(io.st.tok_B1[:, 0], io.pos_B + prev, io.P + prev, mask_BL, keys, values), **sample)


@functools.cache
def _compiled(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn`` through ``torch.compile``, once per process, so its graphs are reused across
    calls (a new batch size or cache length compiles a new graph)."""
    return torch.compile(fn, dynamic=False)


@contextlib.contextmanager
def _fsdp_hooks_detached(model: nn.Module) -> Iterator[None]:
    """While gathered, an FSDP2 model's forward hooks have nothing to do in a no-grad decode step
    (its weights are already unsharded and stay so), but dynamo cannot trace them: each wrapped
    layer would become its own frame, compiled once per layer index until the recompile limit.
    Detach them so the compiled step is one whole-model graph; restored on exit, in order."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if units:
        require_gathered(model, "decode_static(compile=True)")
    saved = [(m, dict(m._forward_pre_hooks), dict(m._forward_hooks)) for m in units]
    for m in units:
        state = m._get_fsdp_state()  # type: ignore[operator]  # FSDPModule API
        m._forward_pre_hooks.pop(state._pre_forward_hook_handle.id, None)
        m._forward_hooks.pop(state._post_forward_hook_handle.id, None)
    try:
        yield
    finally:
        for m, pre, post in saved:
            m._forward_pre_hooks.clear()
            m._forward_pre_hooks.update(pre)
            m._forward_hooks.clear()
            m._forward_hooks.update(post)


def _check_model(model: nn.Module) -> None:
    """Only full-attention models: a sliding-window layer would need its own prepared mask."""
    kinds = set(getattr(model.config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise NotImplementedError(
            f"decode_static supports full-attention models only; this one has layer types {sorted(kinds)}. "
            "Use the dynamic decoder (decoder='dynamic')"
        )


def _cache_lengths(cache: StaticCache) -> list[Tensor]:
    """The per-layer device-side fill counters of a StaticCache (advanced in place by each write)."""
    out = [layer.cumulative_length for layer in cache.layers]
    if not all(isinstance(x, Tensor) for x in out):
        raise RuntimeError(
            "this transformers version keeps StaticCache lengths on the host; a CUDA graph cannot "
            "replay its writes. Use decode_static(graph=False) or a transformers release whose "
            "StaticLayer.cumulative_length is a tensor"
        )
    return out


def _capture(
    step: Callable[[], None], st: DecodeState, cache: StaticCache, pool: object
) -> Callable[[], None]:
    """Capture ``step`` as a CUDA graph; the warm-up and capture runs leave no trace in the state."""
    lengths = _cache_lengths(cache)
    saved_len = [x.clone() for x in lengths]
    saved = {k: v.clone() for k, v in vars(st).items()}
    st.t.fill_(1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(1):  # warm-up: lazy inits and allocator pools outside the capture
            step()
            for x, s in zip(lengths, saved_len):
                x.copy_(s)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        step()
    for x, s in zip(lengths, saved_len):
        x.copy_(s)
    for k, v in saved.items():
        getattr(st, k).copy_(v)
    return g.replay
