"""The batched, KV-cached decode loop: left-padded prefill, then one token per step.

The loop is our own (not ``model.generate``) so that sampling draws from per-sample random
streams and records the exact log-probs replay reproduces. Device-side state (tokens, finished
flags, lengths) is updated with tensor ops; the host only syncs every ``sync_every`` steps to
check "all finished" and stop strings, never once per token.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from unirl.rollout.ar.sampling import sample_next_token


@dataclass
class DecodeOutput:
    """Raw decode results on CPU, before stop-string truncation.

    ``tokens[b, :lengths[b]]`` are row ``b``'s response tokens (a stop token, when hit, is the
    last one); later columns hold padding. ``stopped[b]`` is True when the row ended on a stop
    token id. ``interrupted``: ``decode``'s ``interrupt`` ended the loop early; the rows not
    ``finished`` then hold exactly ``tokens.shape[1]`` tokens each and may be continued.
    """

    tokens: Tensor  # [B, N] int64
    logprobs: Tensor  # [B, N] fp32, 0 after a row finished
    lengths: Tensor  # [B] int64
    stopped: Tensor  # [B] bool
    finished: Tensor | None = None  # [B] bool: stop token, limit or stop string reached
    interrupted: bool = False


def cache_kwarg(model: nn.Module) -> str:
    """The forward keyword for the KV cache: ``cache`` (transformers >= 5.x) or ``past_key_values``."""
    base = model
    get_base = getattr(model, "get_base_model", None)  # peft wrappers
    if callable(get_base):
        base = get_base()
    params = inspect.signature(type(base).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def left_pad(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """``(input_ids [B, P], attention_mask [B, P])`` with prompts right-aligned (left padding)."""
    P = max(len(p) for p in prompts)
    ids_BP = torch.full((len(prompts), P), pad_token_id, dtype=torch.long)
    mask_BP = torch.zeros((len(prompts), P), dtype=torch.long)
    for b, p in enumerate(prompts):
        if p:
            ids_BP[b, P - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask_BP[b, P - len(p) :] = 1
    return ids_BP.to(device), mask_BP.to(device)


class DecodeState:
    """Device buffers of one decode call: sampled tokens, log-probs, lengths, stop flags, the token
    fed back and the step index (fixed addresses, so a captured CUDA graph can read and write them)."""

    def __init__(self, B: int, N: int, device: torch.device, pad_token_id: int) -> None:
        self.tokens_BN = torch.full((B, N), pad_token_id, dtype=torch.long, device=device)
        self.logp_BN = torch.zeros((B, N), dtype=torch.float32, device=device)
        self.lengths_B = torch.zeros(B, dtype=torch.long, device=device)
        self.stopped_B = torch.zeros(B, dtype=torch.bool, device=device)
        self.finished_B = torch.zeros(B, dtype=torch.bool, device=device)
        self.tok_B1 = torch.full((B, 1), pad_token_id, dtype=torch.long, device=device)
        self.t = torch.zeros(1, dtype=torch.long, device=device)  # the step being sampled

    def output(self, steps: int) -> DecodeOutput:
        """The first ``steps`` steps, on CPU."""
        return DecodeOutput(
            tokens=self.tokens_BN[:, :steps].cpu(),
            logprobs=self.logp_BN[:, :steps].cpu(),
            lengths=self.lengths_B.cpu(),
            stopped=self.stopped_B.cpu(),
            finished=self.finished_B.cpu(),
        )

    def sync_finished(
        self, steps: int, stop_check: Callable[[list[int]], bool] | None, group: Any = None
    ) -> bool:
        """One host sync after ``steps`` steps: mark the rows whose text holds a stop string
        (``stop_check``) finished, then whether every row is, on every rank of ``group`` if given."""
        if stop_check is not None:
            _mark_stop_strings(self.tokens_BN[:, :steps], self.lengths_B, self.finished_B, stop_check)
        done = self.finished_B.all().to(torch.int32)
        if group is not None:
            torch.distributed.all_reduce(done, op=torch.distributed.ReduceOp.MIN, group=group)
        return bool(done)


def stop_tensors(
    limits: Sequence[int], stop_token_ids: Sequence[int], pad_token_id: int, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """``(limits_B, stop_ids, pad)`` on ``device``: what ``record_step`` needs to end rows."""
    limits_B = torch.tensor(list(limits), dtype=torch.long, device=device)
    stop_ids = torch.tensor(sorted(set(stop_token_ids)), dtype=torch.long, device=device)
    pad = torch.tensor(pad_token_id, dtype=torch.long, device=device)
    return limits_B, stop_ids, pad


def prefill(model: nn.Module, ids_BP: Tensor, mask_BP: Tensor, kw: str, cache: Any) -> Tensor:
    """Run the left-padded prompt block into ``cache``; the logits at each row's last prompt
    position ``[B, V]``. ``kw`` is the model's cache keyword (``cache_kwarg``)."""
    positions_BP = (mask_BP.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=ids_BP, attention_mask=mask_BP, position_ids=positions_BP, use_cache=True, logits_to_keep=1,
        **{kw: cache},
    )  # fmt: skip
    logits_BV: Tensor = out.logits[:, -1]
    return logits_BV


def record_step(
    st: DecodeState,
    logits_BV: Tensor,
    u_BN: Tensor,
    limits_B: Tensor,
    stop_ids: Tensor,
    pad: Tensor,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
) -> None:
    """Draw step ``st.t``'s token from ``logits_BV`` and record it (all tensor ops, no host sync)."""
    u_B = u_BN.index_select(1, st.t).squeeze(1)
    tok_B, lp_B = sample_next_token(logits_BV, u_B, temperature=temperature, top_k=top_k, top_p=top_p)
    active_B = ~st.finished_B
    tok_B = torch.where(active_B, tok_B, pad)
    st.tokens_BN.index_copy_(1, st.t, tok_B[:, None])
    st.logp_BN.index_copy_(1, st.t, torch.where(active_B, lp_B, torch.zeros_like(lp_B))[:, None])
    st.lengths_B.add_(active_B.long())
    hit_B = active_B & torch.isin(tok_B, stop_ids)
    st.stopped_B.logical_or_(hit_B)
    st.finished_B.logical_or_(hit_B | (st.lengths_B >= limits_B))
    st.tok_B1.copy_(tok_B[:, None])


@torch.no_grad()
def decode(
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
    lockstep_group: Any = None,
    interrupt: Callable[[], bool] | None = None,
    interrupt_every: int = 0,
) -> DecodeOutput:
    """Sample up to ``limits[b]`` tokens for each prompt; ``uniforms_BN[b, t]`` drives step ``t``.

    Args:
        prompts: non-empty token-id lists.
        uniforms_BN: ``[B, N]`` uniforms with ``N >= max(limits)``, one per (row, step).
        limits: per-row max new tokens (already clipped to the context window).
        stop_check: host-side predicate on a row's tokens so far ("contains a stop string");
            called every ``sync_every`` steps for unfinished rows so the loop can end early. It
            only shortens the loop; the caller truncates at the exact stop position afterwards.
        lockstep_group: a ``torch.distributed`` process group (or ``"world"``) whose ranks must
            run the same number of forwards, e.g. when the model is FSDP-sharded and each forward
            all-gathers weights. The ranks agree on the step budget (max over ranks) and leave
            the loop together (when every rank is finished). Every rank must call ``decode`` the
            same number of times. None: no communication.
        interrupt: host-side predicate asked every ``interrupt_every`` steps while a row is
            unfinished (partial rollouts: "a newer policy is waiting"); True ends the loop there
            with ``DecodeOutput.interrupted`` set, for the caller to continue the unfinished rows
            (see ``partial.decode_partial``). Not with ``lockstep_group``.
    """
    if interrupt is not None and (interrupt_every < 1 or lockstep_group is not None):
        raise ValueError(
            f"interrupt needs interrupt_every >= 1 (got {interrupt_every}) and no lockstep_group"
        )
    device = next(model.parameters()).device
    B = len(prompts)
    group = _resolve_group(lockstep_group)
    N, u_BN = _step_budget(limits, uniforms_BN, B, device, group)
    ids_BP, mask_BP, attn_BL, pos_B = _prompt_block(prompts, pad_token_id, device, N)
    P = ids_BP.shape[1]
    limits_B, stop_ids, pad = stop_tensors(limits, stop_token_ids, pad_token_id, device)

    st = DecodeState(B, N, device, pad_token_id)
    sample = dict(temperature=temperature, top_k=top_k, top_p=top_p)

    kw = cache_kwarg(model)
    cache = DynamicCache(config=getattr(model, "config", None))
    logits_BV = prefill(model, ids_BP, mask_BP, kw, cache)
    steps = 0
    for t in range(N):
        st.t.fill_(t)
        record_step(st, logits_BV, u_BN, limits_B, stop_ids, pad, **sample)
        steps = t + 1
        if steps == N:
            break
        if steps % sync_every == 0 and st.sync_finished(steps, stop_check, group):
            break
        # a row already holding a stop string is not continued (interrupt excludes lockstep)
        if (
            interrupt is not None
            and steps % interrupt_every == 0
            and not st.sync_finished(steps, stop_check)
            and interrupt()
        ):
            result = st.output(steps)
            result.interrupted = True
            return result
        out = model(
            input_ids=st.tok_B1, attention_mask=attn_BL[:, : P + steps], position_ids=(pos_B + t)[:, None],
            use_cache=True, **{kw: cache},
        )  # fmt: skip
        logits_BV = out.logits[:, -1]
    return st.output(steps)


def _step_budget(
    limits: Sequence[int], uniforms_BN: Tensor, B: int, device: torch.device, group: Any
) -> tuple[int, Tensor]:
    """``(N, u_BN)``: the steps to run (with ``group``, the max over its ranks) and the uniforms
    on ``device``, zero-padded to ``N`` columns (only with lockstep: the extra steps are past
    every local row's limit)."""
    N = max(limits)
    if group is not None:
        N = _all_reduce_int(N, device, group, torch.distributed.ReduceOp.MAX)
    u_BN = uniforms_BN.to(device)
    if u_BN.shape[1] < N:
        u_BN = torch.cat([u_BN, u_BN.new_zeros(B, N - u_BN.shape[1])], dim=1)
    return N, u_BN


def _prompt_block(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device, N: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``left_pad``'s ``(ids_BP, mask_BP)``, the attention mask ``attn_BL`` over prompt and ``N``
    response slots, and ``pos_B``, the position of each row's first response token."""
    ids_BP, mask_BP = left_pad(prompts, pad_token_id, device)
    B, P = ids_BP.shape
    attn_BL = torch.ones((B, P + N), dtype=torch.long, device=device)
    attn_BL[:, :P] = mask_BP
    pos_B = mask_BP.sum(-1)
    return ids_BP, mask_BP, attn_BL, pos_B


def _resolve_group(group: Any) -> Any:
    """None when no lockstep is wanted or there is a single process; the default group for "world"."""
    if group is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    group = torch.distributed.group.WORLD if isinstance(group, str) and group == "world" else group
    return group if torch.distributed.get_world_size(group) > 1 else None


def _all_reduce_int(x: int, device: torch.device, group: Any, op: Any) -> int:
    t = torch.tensor([x], dtype=torch.long, device=device)
    torch.distributed.all_reduce(t, op=op, group=group)
    return int(t.item())


def _mark_stop_strings(
    tokens_BT: Tensor, lengths_B: Tensor, finished_B: Tensor, stop_check: Callable[[list[int]], bool]
) -> None:
    """One host sync: mark unfinished rows whose text already contains a stop string as finished."""
    tokens, lengths, finished = tokens_BT.cpu(), lengths_B.cpu(), finished_B.cpu()
    hits = [
        b for b in range(tokens.shape[0]) if not finished[b] and stop_check(tokens[b, : lengths[b]].tolist())
    ]
    if hits:
        finished_B[torch.tensor(hits, device=finished_B.device)] = True
