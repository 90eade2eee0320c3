"""Tiny real components for the stack / backend / checkpoint tests.

- `BigramPolicy` + `TokenPipeline`: a next-token model over a vocab of 8 with teacher-forced
  replay of response tokens (the AR replay contract: logp [B, T], mask [B, T]).
- `TokenPPO`: a PPO-clip token loss that follows the BatchTotals contract (masked token sum
  divided by the GLOBAL `num_tokens`); `local_norm=True` divides by the micro-batch's own token
  count instead (the classic bug the invariance tests must catch).
- `VelocityMLP` + `FlowPipeline`: a flow-matching velocity model and a replay_step built on the
  rollout package's Flow-SDE kernel, so the real FlowGRPO algorithm can run through the stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch

from unirl.rollout.sde.flow_sde import flow_sde_step
from unirl.train.algorithms.base import BatchTotals
from unirl.types import Conditions, LatentTrajectory, Part, TextSegment


class BigramPolicy(torch.nn.Module):
    def __init__(self, vocab: int = 8, dim: int = 4) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, prev_BT: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.head(self.emb(prev_BT)), dim=-1)


@dataclass
class TokenReplay:
    logp: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] bool


class TokenPipeline:
    stage = "ar"

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def replay_logprobs(self, parts: Sequence[Part]) -> TokenReplay:
        segs = [p.segment for p in parts]
        t_max = max(len(s.response_ids) for s in segs)
        prev = torch.zeros(len(segs), t_max, dtype=torch.long)
        tgt = torch.zeros(len(segs), t_max, dtype=torch.long)
        mask = torch.zeros(len(segs), t_max, dtype=torch.bool)
        for b, s in enumerate(segs):
            ids = [s.prompt_ids[-1], *s.response_ids]
            n = len(s.response_ids)
            prev[b, :n] = torch.tensor(ids[:-1])
            tgt[b, :n] = torch.tensor(ids[1:])
            mask[b, :n] = True if s.loss_mask is None else s.loss_mask
        logp = self.module(prev).gather(-1, tgt[..., None])[..., 0]
        return TokenReplay(logp=logp, mask=mask)


class TokenPPO:
    name = "token_ppo"
    needs_old_logprobs = True

    def __init__(self, clip: float = 0.2, local_norm: bool = False) -> None:
        self.clip = clip
        self.local_norm = local_norm
        self.prepared = 0

    def prepare(self, parts: Sequence[Part], pipeline: TokenPipeline) -> None:
        self.prepared += 1
        rep = pipeline.replay_logprobs(parts)
        for b, p in enumerate(parts):
            p.segment.log_probs = rep.logp[b, : len(p.segment.response_ids)].detach().clone()

    def loss(self, parts: Sequence[Part], pipeline: TokenPipeline, totals: BatchTotals):
        rep = pipeline.replay_logprobs(parts)
        old_logprobs = torch.zeros_like(rep.logp)
        for b, p in enumerate(parts):
            old_logprobs[b, : len(p.segment.response_ids)] = p.segment.log_probs
        adv = torch.tensor([p.advantage for p in parts])[:, None]
        ratio = torch.exp(rep.logp - old_logprobs)
        per = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - self.clip, 1 + self.clip))
        per = per * rep.mask
        denom = rep.mask.sum() if self.local_norm else totals.num_tokens
        return per.sum() / denom, {"ratio_mean": float(ratio.detach()[rep.mask].mean())}


def token_parts(n: int = 8, seed: int = 0) -> list[Part]:
    """n text Parts with different lengths, masks and advantages."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for i in range(n):
        length = 1 + i % 4
        ids = torch.randint(0, 8, (length,), generator=g).tolist()
        mask = torch.ones(length, dtype=torch.bool)
        if length > 2:
            mask[1] = False
        seg = TextSegment(prompt_ids=[i % 8], response_ids=ids, loss_mask=mask)
        parts.append(Part(name="ar", segment=seg, advantage=float(i % 3) - 1.0 + 0.1 * i, status="completed"))
    return parts


class VelocityMLP(torch.nn.Module):
    def __init__(self, dim: int = 4, cond: int = 2) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(dim + 1 + cond, 16), torch.nn.Tanh(), torch.nn.Linear(16, dim)
        )

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, sigma[:, None], cond], dim=-1))


@dataclass
class StepReplay:
    log_prob: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    velocity: torch.Tensor


class FlowPipeline:
    """Samples with the Flow-SDE kernel and replays stored steps with the same kernel."""

    stage = "diffusion"
    eta = 0.7

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def velocity(self, latents, sigma, conditions, guidance=1.0):
        cond = torch.stack([torch.as_tensor(c["emb"]) for c in conditions])
        return self.module(latents, sigma, cond)

    def replay_step(self, parts: Sequence[Part], step: int) -> StepReplay:
        segs = [p.segment for p in parts]
        x = torch.stack([torch.as_tensor(s.latent_at(step)) for s in segs])
        xn = torch.stack([torch.as_tensor(s.latent_at(step + 1)) for s in segs])
        sig = segs[0].sigmas
        v = self.velocity(x, torch.full((len(parts),), sig[step]), [p.conditions for p in parts])
        r = flow_sde_step(x, v, sig[step], sig[step + 1], self.eta, sigma_at_one=sig[1], x_next=xn)
        return StepReplay(log_prob=r.log_prob, mean=r.mean, std=r.std, velocity=v)

    @torch.no_grad()
    def rollout(self, n: int, sde_sets: Sequence[list[int]], seed: int = 0) -> list[Part]:
        sigmas = [1.0, 0.7, 0.4, 0.0]
        g = torch.Generator().manual_seed(seed)
        parts = []
        for i in range(n):
            sde = sde_sets[i % len(sde_sets)]
            cond = Conditions(tensors={"emb": torch.randn(2, generator=g)})
            xs = [torch.randn(4, generator=g)]
            logps = []
            for j in range(len(sigmas) - 1):
                v = self.velocity(xs[-1][None], torch.tensor([sigmas[j]]), [cond])
                eta = self.eta if j in sde else 0.0
                r = flow_sde_step(
                    xs[-1][None],
                    v,
                    sigmas[j],
                    sigmas[j + 1],
                    eta,
                    sigma_at_one=sigmas[1],
                    noise=torch.randn(1, 4, generator=g),
                )
                xs.append(r.x_next[0])
                if j in sde:
                    logps.append(r.log_prob[0])
            seg = LatentTrajectory(
                latents=torch.stack(xs),
                positions=list(range(len(sigmas))),
                sigmas=sigmas,
                sde_indices=list(sde),
                log_probs=torch.stack(logps).float(),
            )
            parts.append(
                Part(
                    name="diffusion",
                    segment=seg,
                    conditions=cond,
                    advantage=float(i % 3) - 1.0 + 0.1 * i,
                    status="completed",
                )
            )
        return parts


def leave_world() -> None:
    """End a spawned gloo rank: destroy the process group, flush, and exit without the interpreter's
    teardown. Once DTensors were made, torch keeps the group's gloo threads alive past
    ``destroy_process_group``; destroying them during static teardown races with the peer's exit
    and aborts the process ("terminate called without an active exception") in about one run in
    four. Call it only after the rank's work (and its result file) is done."""
    import os
    import sys

    import torch.distributed as dist

    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.fixture
def tiny() -> object:
    """Namespace of the helpers above (test modules can't import conftest under importlib mode)."""

    class NS:
        pass

    ns = NS()
    for name, obj in globals().items():
        if not name.startswith("_") and (isinstance(obj, type) or callable(obj)):
            setattr(ns, name, obj)
    return ns
