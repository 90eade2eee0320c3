"""Text Parts: recording a finished completion on one, and reading them into padded ``[B, T]``
tensors (stored log-probs, loss masks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from unirl.types import ARSamplingParams, Part, PartStatus, TextPrimitive, TextSegment, VersionSpan, to_torch

STATUS: dict[str, PartStatus] = {"stop": "completed", "length": "truncated", "abort": "aborted"}


def fill_text_part(
    part: Part,
    *,
    prompt_ids: list[int],
    response_ids: list[int],
    log_probs: Tensor | Sequence[float],
    text: str,
    finish: Literal["stop", "length", "abort"],
    params: ARSamplingParams,
    versions: list[VersionSpan] | None = None,
) -> None:
    """Record one finished completion on ``part`` (every engine's way): the TextSegment with a
    full loss mask, the assistant text output, the sampling params and the status
    (stop -> completed, length -> truncated, abort -> aborted). ``versions``: a partial
    rollout's spans (those starting past the response, cut at a stop string, are dropped)."""
    part.segment = TextSegment(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        log_probs=torch.as_tensor(log_probs, dtype=torch.float32),
        loss_mask=torch.ones(len(response_ids), dtype=torch.bool),
        finish_reason=finish,
        versions=None if versions is None else [v for v in versions if v.start < len(response_ids)],
    )
    part.outputs = [TextPrimitive(text=text, role="assistant")]
    part.sampling_params = params
    part.status = STATUS[finish]


def text_segment(part: Part) -> TextSegment:
    """The Part's TextSegment; TypeError naming the part when it holds something else."""
    seg = part.segment
    if not isinstance(seg, TextSegment):
        kind = None if seg is None else getattr(seg, "kind", type(seg).__name__)
        raise TypeError(f"part {part.name!r} has segment kind {kind!r}; AR replay needs a 'text' segment")
    return seg


def ar_params(part: Part, default: ARSamplingParams | None = None) -> ARSamplingParams:
    """The Part's ARSamplingParams, else ``default``; TypeError when neither is available."""
    sp = part.sampling_params
    if isinstance(sp, ARSamplingParams):
        return sp
    if sp is not None and getattr(sp, "kind", None) == "composed":
        return sp.ar  # type: ignore[union-attr]
    if default is None:
        raise TypeError(f"part {part.name!r} has sampling_params {sp!r}; need ARSamplingParams")
    return default


def pad_rows(
    rows: Sequence[Tensor], fill: float | bool, dtype: torch.dtype, device: torch.device | str
) -> Tensor:
    """Right-pad 1-D tensors into ``[B, max_len]``."""
    T = max((int(r.shape[0]) for r in rows), default=0)
    out = torch.full((len(rows), T), fill, dtype=dtype, device=device)
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = r.to(device=device, dtype=dtype)
    return out


def loss_mask(parts: Sequence[Part], device: torch.device | str = "cpu") -> Tensor:
    """``[B, T]`` bool: True on response tokens whose loss mask is set (all when it is None)."""
    rows = []
    for p in parts:
        seg = text_segment(p)
        n = len(seg.response_ids)
        rows.append(
            torch.ones(n, dtype=torch.bool) if seg.loss_mask is None else to_torch(seg.loss_mask).bool()
        )
    return pad_rows(rows, False, torch.bool, device)


def behavior_logprobs(parts: Sequence[Part], device: torch.device | str = "cpu") -> Tensor:
    """``[B, T]`` fp32: the sampler's stored per-token log-probs, 0-padded (no gradient).

    These are the behaviour log-probs (``behavior_logprobs``: the policy that generated the data).
    They serve as the ``old_logprobs`` of the clipped ratio when the algorithm does not recompute
    them (``old_logprobs: rollout``), and weight the off-policy correction when it does.
    ValueError when a part has none (e.g. SFT data).
    """
    rows = []
    for p in parts:
        seg = text_segment(p)
        if seg.log_probs is None:
            raise ValueError(
                f"part {p.name!r} has no stored log_probs; it was not sampled by a rollout engine"
            )
        rows.append(to_torch(seg.log_probs).float())
    return pad_rows(rows, 0.0, torch.float32, device)
