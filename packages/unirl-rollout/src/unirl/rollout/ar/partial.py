"""Partial rollouts (slime / AReaL style): a generation interrupted by a newer policy continues with it.

Decoding runs in chunks of ``chunk_tokens`` steps; between chunks the rollout side's
``WeightSwap`` is asked whether a newer policy was published. If so, decoding stops, the swap
loads the new weights, and the unfinished rows continue from the tokens they already have: prompt
+ generated prefix are prefilled again with the new weights (the KV cache was computed by the
old ones) and decoding goes on. Step ``t`` of a row always draws uniform ``t`` of its stream, so a
continuation with unchanged weights draws the tokens of the uninterrupted run. Nothing restarts
and no token is dropped: each token keeps the log-prob of the policy that sampled it, and each
row records which versions sampled which tokens (``TextSegment.versions``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from unirl.rollout.ar.decode import DecodeOutput, decode
from unirl.types import VersionSpan


class WeightSwap(Protocol):
    """The rollout side's weights as a partial rollout sees them; called on the decoding thread."""

    def held(self) -> tuple[int, int]:
        """``(policy version, weight version)`` of the weights the model holds now."""
        ...

    def newer(self) -> bool:
        """A newer policy is waiting (cheap: asked between every two chunks)."""
        ...

    def swap(self) -> None:
        """Load the newest policy into the model (verified by the implementation)."""
        ...


@dataclass(frozen=True)
class PartialRollouts:
    """Interrupt a generation every ``chunk_tokens`` decode steps when ``swap`` has newer weights."""

    swap: WeightSwap
    chunk_tokens: int

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1:
            raise ValueError(f"partial rollouts: chunk_tokens={self.chunk_tokens} must be >= 1")


def decode_partial(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    uniforms_BN: Tensor,
    limits: Sequence[int],
    partial: PartialRollouts,
    **decode_kw: Any,
) -> tuple[DecodeOutput, list[list[VersionSpan]]]:
    """``decode`` across weight swaps: the output of the whole generation and each row's spans.

    ``decode_kw``: the remaining ``decode`` arguments (sampling, stop ids, padding, ...)."""
    B = len(prompts)
    N = max(limits)
    pad = int(decode_kw["pad_token_id"])
    tokens_BN = torch.full((B, N), pad, dtype=torch.long)
    logp_BN = torch.zeros((B, N), dtype=torch.float32)
    lengths_B = torch.zeros(B, dtype=torch.long)
    stopped_B = torch.zeros(B, dtype=torch.bool)
    spans: list[list[VersionSpan]] = [[] for _ in range(B)]
    rows, done = list(range(B)), 0  # the rows still decoding; each has ``done`` tokens
    while rows:
        version, weight_version = partial.swap.held()
        out = decode(
            model,
            [[*prompts[b], *tokens_BN[b, :done].tolist()] for b in rows],
            uniforms_BN=uniforms_BN[rows, done:],
            limits=[limits[b] - done for b in rows],
            interrupt=partial.swap.newer,
            interrupt_every=partial.chunk_tokens,
            **decode_kw,
        )
        for i, b in enumerate(rows):
            n = int(out.lengths[i])
            tokens_BN[b, done : done + n] = out.tokens[i, :n]
            logp_BN[b, done : done + n] = out.logprobs[i, :n]
            lengths_B[b], stopped_B[b] = done + n, out.stopped[i]
            if n and (not spans[b] or spans[b][-1].version != version):
                spans[b].append(VersionSpan(start=done, version=version, weight_version=weight_version))
        if not out.interrupted:
            break
        assert out.finished is not None
        rows = [b for i, b in enumerate(rows) if not bool(out.finished[i])]
        done += int(out.tokens.shape[1])
        partial.swap.swap()
    T = int(lengths_B.max()) if B else 0
    result = DecodeOutput(
        tokens=tokens_BN[:, :T], logprobs=logp_BN[:, :T], lengths=lengths_B, stopped=stopped_B
    )
    return result, spans
