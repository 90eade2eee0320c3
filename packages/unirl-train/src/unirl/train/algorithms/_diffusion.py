"""Shared plumbing of the diffusion policy losses: which SDE steps each Part trains on, the old
log-probs / old means stored on its LatentTrajectory, and the reference replay for KL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from unirl.train.algorithms.base import StepReplayLike, as_tensor, latent_segment
from unirl.types import DiffusionSamplingParams, LatentTrajectory, Part


@dataclass(frozen=True)
class StepGroup:
    """The Parts of a micro-batch that train on denoising step ``step``.

    ``rows``: their positions in the micro-batch; ``slots``: the index of ``step`` in each one's
    ``sde_indices`` (where its old log-prob / old mean is stored).
    """

    step: int
    rows: list[int]
    slots: list[int]


def trained_steps(num_sde_steps: int, fraction: float) -> int:
    """How many of a Part's SDE steps are trained: ``int(n * fraction)`` (Flow-GRPO's
    ``timestep_fraction``), at least 1 when the Part has any."""
    if num_sde_steps == 0:
        return 0
    return max(1, min(num_sde_steps, int(num_sde_steps * fraction + 1e-9)))


def group_by_step(segs: Sequence[LatentTrajectory], fraction: float = 1.0) -> list[StepGroup]:
    """One group per distinct SDE step of the micro-batch, in increasing step order.

    With ``fraction`` < 1 each Part contributes only its first ``trained_steps(n, fraction)`` SDE
    steps (in ``sde_indices`` order), the same steps for every Part that shares its indices, so each
    group replays one full micro-batch shape (the rollout's, which keeps the first-update ratio 1)."""
    by_step: dict[int, tuple[list[int], list[int]]] = {}
    for b, seg in enumerate(segs):
        keep = trained_steps(len(seg.sde_indices), fraction)
        for k, j in enumerate(seg.sde_indices[:keep]):
            rows, slots = by_step.setdefault(j, ([], []))
            rows.append(b)
            slots.append(k)
    return [StepGroup(j, *by_step[j]) for j in sorted(by_step)]


def behavior_logprobs(segs: Sequence[LatentTrajectory], g: StepGroup, device: torch.device) -> Tensor:
    """``[n]`` fp32 behaviour log-probs of step ``g.step`` of each Part in the group: the ones the
    sampler stored on the segment (``segment.log_probs``)."""
    return torch.stack([as_tensor(segs[b].log_probs)[k] for b, k in zip(g.rows, g.slots)]).to(
        device=device, dtype=torch.float32
    )


@torch.no_grad()
def recompute_old_logprobs(
    parts: Sequence[Part], pipeline: Any, batch_size: int, algorithm: str
) -> dict[int, Tensor]:
    """``id(part) -> [n_sde]`` fp32 log-probs of each Part's stored transitions under the current
    weights (the old, or proximal, policy), replayed in chunks of ``batch_size`` Parts, one step
    at a time."""
    out: dict[int, Tensor] = {}
    for i in range(0, len(parts), batch_size):
        chunk = parts[i : i + batch_size]
        segs = [latent_segment(p, algorithm) for p in chunk]
        rows = [torch.zeros(len(s.sde_indices)) for s in segs]
        for g in group_by_step(segs):
            sub = [chunk[b] for b in g.rows]
            old_logprobs = checked_log_prob(pipeline.replay_step(sub, g.step), sub, g.step, algorithm)
            for r, (b, k) in enumerate(zip(g.rows, g.slots)):
                rows[b][k] = old_logprobs[r].float().cpu()
        out.update({id(p): row for p, row in zip(chunk, rows)})
    return out


def recomputed_old_logprobs(
    old_logprobs: dict[int, Tensor], parts: Sequence[Part], g: StepGroup, device: torch.device
) -> Tensor:
    """``[n]`` old (proximal) log-probs of step ``g.step`` for ``parts`` (the group's rows, in
    order), picked from ``recompute_old_logprobs``' output."""
    missing = [p.name for p in parts if id(p) not in old_logprobs]
    if missing:
        raise ValueError(f"parts {missing[:3]} have no proximal log-probs; call prepare() first")
    return torch.stack([old_logprobs[id(p)][k] for p, k in zip(parts, g.slots)]).to(device=device)


def old_means(segs: Sequence[LatentTrajectory], g: StepGroup, device: torch.device) -> Tensor:
    """``[n, ...]`` fp32 old Gaussian means of step ``g.step`` of each Part in the group."""
    return torch.stack([as_tensor(segs[b].old_means)[k] for b, k in zip(g.rows, g.slots)]).to(
        device=device, dtype=torch.float32
    )


def checked_log_prob(rep: StepReplayLike, parts: Sequence[Part], step: int, algorithm: str) -> Tensor:
    """The replayed log-prob, or a ValueError when the step was deterministic (no density)."""
    if rep.log_prob is None:
        raise ValueError(
            f"{algorithm}: replay of step {step} (parts {[p.name for p in parts][:3]}...) returned no log-prob: "
            "the step is deterministic (ODE strategy or eta == 0). Only SDE steps can be trained: "
            "set sampling_params.eta > 0 and a stochastic sde_strategy"
        )
    return rep.log_prob


def check_trainable(
    parts: Sequence[Part], algorithm: str, *, needs_log_probs: bool
) -> list[LatentTrajectory]:
    """The LatentTrajectories of ``parts``; errors name the Part when one cannot be trained."""
    segs = [latent_segment(p, algorithm) for p in parts]
    for p, seg in zip(parts, segs):
        if needs_log_probs and seg.sde_indices and seg.log_probs is None:
            raise ValueError(
                f"{algorithm}: part {p.name!r} has sde_indices {seg.sde_indices} but no log_probs; "
                "the rollout must record one log-prob per SDE step"
            )
    return segs


def check_sampling(parts: Sequence[Part], algorithm: str, strategy: str | None, schedule: str | None) -> None:
    """Named variants (DanceGRPO, MixGRPO) require the rollout's SDE strategy / index schedule."""
    for p in parts:
        sp = p.sampling_params
        if not isinstance(sp, DiffusionSamplingParams):
            continue
        if strategy is not None and sp.sde_strategy != strategy:
            raise ValueError(
                f"{algorithm} expects rollouts sampled with sde_strategy={strategy!r}; part {p.name!r} "
                f"used {sp.sde_strategy!r}. Set the diffusion sampling params' sde_strategy to {strategy!r} "
                "(see the config's sampling_overrides()) or use kind='flow_grpo'"
            )
        if schedule is not None and sp.sde_schedule.kind != schedule:
            raise ValueError(
                f"{algorithm} expects sde_schedule.kind={schedule!r}; part {p.name!r} used "
                f"{sp.sde_schedule.kind!r}. See the config's sampling_overrides()"
            )


@torch.no_grad()
def fill_old_means(
    parts: Sequence[Part], pipeline: Any, batch_size: int, algorithm: str, *, recompute: bool
) -> None:
    """Record pi_old's Gaussian mean of every SDE step on ``segment.old_means`` (fp32, CPU).

    Parts that already carry ``old_means`` (recorded at rollout) keep them unless ``recompute``.
    Replays in chunks of ``batch_size`` Parts under no_grad.
    """
    todo = [p for p in parts if recompute or latent_segment(p, algorithm).old_means is None]
    for i in range(0, len(todo), batch_size):
        chunk = todo[i : i + batch_size]
        segs = [latent_segment(p, algorithm) for p in chunk]
        buffers: list[list[Tensor | None]] = [[None] * len(s.sde_indices) for s in segs]
        for g in group_by_step(segs):
            rep = pipeline.replay_step([chunk[b] for b in g.rows], g.step)
            mean = rep.mean.detach().float().cpu()
            for r, (b, k) in enumerate(zip(g.rows, g.slots)):
                buffers[b][k] = mean[r]
        for seg, buf in zip(segs, buffers):
            if buf:
                seg.old_means = torch.stack([t for t in buf if t is not None])
