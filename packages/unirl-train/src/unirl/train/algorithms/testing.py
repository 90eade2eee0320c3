"""Test doubles for the replay interfaces, and a contract check every StageAlgorithm passes.

``FakeFlowPipeline`` is a tiny flow-matching "model" (one ``nn.Linear`` velocity) that samples
trajectories with the real Flow-SDE kernel of ``unirl.rollout.sde`` and replays them through
``replay_step`` / ``velocity`` exactly like ``FlowMatchPipeline``. ``FakeTokenPipeline`` is a
bigram LM with ``replay_logprobs``. They stand in for the interfaces only: use them to test
algorithms and stacks without a real model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from unirl.rollout.sde.flow_sde import flow_sde_step
from unirl.rollout.sde.ode import ode_step
from unirl.train.algorithms.base import BatchTotals, StageAlgorithm, as_tensor
from unirl.types import (
    ARSamplingParams,
    Conditions,
    DiffusionSamplingParams,
    LatentTrajectory,
    Part,
    TextSegment,
)


@dataclass
class FakeStepReplay:
    log_prob: Tensor | None
    mean: Tensor
    std: Tensor
    velocity: Tensor


@dataclass
class FakeTokenReplay:
    logp: Tensor
    mask: Tensor


class FakeFlowPipeline:
    """``v = W [x, emb, sigma] + b`` over latents of shape ``(C, H, W)``; Flow-SDE with ``eta``."""

    stage = "diffusion"

    def __init__(self, latent_shape: tuple[int, ...] = (2, 2, 2), emb_dim: int = 3, seed: int = 0) -> None:
        self.latent_shape = latent_shape
        self.emb_dim = emb_dim
        d = math.prod(latent_shape)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.module = nn.Linear(d + emb_dim + 1, d)
        self.calls = 0

    def velocity(
        self, latents: Tensor, sigma: Tensor, conditions: Sequence[Conditions], guidance: float
    ) -> Tensor:
        self.calls += 1
        x = latents.float().flatten(1)
        emb = torch.stack([as_tensor(c["emb"]).float() for c in conditions])
        s = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1, 1).expand(x.shape[0], 1)
        return self.module(torch.cat([x, emb, s], dim=1)).view(latents.shape)

    def replay_step(self, parts: Sequence[Part], step: int) -> FakeStepReplay:
        segs = [p.segment for p in parts]
        x = torch.stack([as_tensor(s.latent_at(step)).float() for s in segs])  # type: ignore[union-attr]
        x_next = torch.stack([as_tensor(s.latent_at(step + 1)).float() for s in segs])  # type: ignore[union-attr]
        sig = torch.tensor([s.sigmas for s in segs], dtype=torch.float32)  # type: ignore[union-attr]
        eta = parts[0].sampling_params.eta  # type: ignore[union-attr]
        v = self.velocity(x, sig[:, step], [p.conditions for p in parts], 1.0)  # type: ignore[misc]
        r = flow_sde_step(x, v, sig[:, step], sig[:, step + 1], eta, sigma_at_one=sig[:, 1], x_next=x_next)
        return FakeStepReplay(log_prob=r.log_prob, mean=r.mean, std=r.std, velocity=v)

    @torch.no_grad()
    def sample(
        self,
        n: int,
        *,
        num_steps: int = 4,
        sde_indices: Sequence[int] | None = None,
        eta: float = 0.7,
        seed: int = 0,
        advantages: Sequence[float] | None = None,
        record_old_means: bool = False,
    ) -> list[Part]:
        """``n`` Parts sampled with the current weights (every latent stored)."""
        g = torch.Generator().manual_seed(seed)
        sigmas = [1.0 - i / num_steps * 0.95 for i in range(num_steps)] + [0.0]
        sde = list(range(num_steps)) if sde_indices is None else list(sde_indices)
        emb = torch.randn(n, self.emb_dim, generator=g)
        conds = [Conditions(tensors={"emb": emb[b]}) for b in range(n)]
        x = torch.randn(n, *self.latent_shape, generator=g)
        sig = torch.tensor(sigmas, dtype=torch.float32)
        lats: list[Tensor] = [x]
        lps: list[Tensor] = []
        means: list[Tensor] = []
        for j in range(num_steps):
            v = self.velocity(x, sig[j].expand(n), conds, 1.0)
            if j in sde:
                z = torch.randn(x.shape, generator=g)
                r = flow_sde_step(x, v, sig[j], sig[j + 1], eta, sigma_at_one=sig[1], noise=z)
                if r.log_prob is not None:
                    lps.append(r.log_prob)
                means.append(r.mean)
            else:
                r = ode_step(x, v, sig[j], sig[j + 1])
            x = r.x_next
            lats.append(x)
        lat = torch.stack(lats, dim=1)
        params = DiffusionSamplingParams(num_steps=num_steps, height=8, width=8, eta=eta, sigmas=sigmas)
        parts = []
        for b in range(n):
            seg = LatentTrajectory(
                latents=lat[b].clone(),
                positions=list(range(num_steps + 1)),
                sigmas=sigmas,
                sde_indices=sde,
                log_probs=torch.stack([lp[b] for lp in lps]).float() if lps else None,
                old_means=torch.stack([m[b] for m in means]) if record_old_means and means else None,
            )
            adv = None if advantages is None else float(advantages[b])
            parts.append(
                Part(
                    name="diffusion",
                    segment=seg,
                    conditions=conds[b],
                    sampling_params=params,
                    advantage=adv,
                    status="completed",
                )
            )
        return parts


class FakeTokenPipeline:
    """Bigram LM: ``logp(y_t | y_{t-1}) = log_softmax(E[y_{t-1}] / temperature)`` over ``vocab``."""

    stage = "ar"

    def __init__(self, vocab: int = 6, seed: int = 0) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.module = nn.Embedding(vocab, vocab)
        self.vocab = vocab

    def _logp_table(self, temperature: float) -> Tensor:
        return torch.log_softmax(self.module.weight.float() / temperature, dim=-1)

    def replay_logprobs(self, parts: Sequence[Part]) -> FakeTokenReplay:
        segs: list[TextSegment] = [p.segment for p in parts]  # type: ignore[misc]
        T = max(len(s.response_ids) for s in segs)
        mask = torch.zeros(len(parts), T, dtype=torch.bool)
        rows = []
        tables: dict[float, Tensor] = {}
        for b, (p, s) in enumerate(zip(parts, segs)):
            temp = p.sampling_params.temperature if isinstance(p.sampling_params, ARSamplingParams) else 1.0
            ids = [s.prompt_ids[-1], *s.response_ids]
            n = len(s.response_ids)
            if temp not in tables:
                tables[temp] = self._logp_table(temp)
            row = tables[temp][torch.tensor(ids[:-1]), torch.tensor(ids[1:])]
            rows.append(torch.nn.functional.pad(row, (0, T - n)))
            mask[b, :n] = True if s.loss_mask is None else as_tensor(s.loss_mask).bool()
        logp = torch.stack(rows)
        return FakeTokenReplay(logp=logp.masked_fill(~mask, 0.0), mask=mask)

    @torch.no_grad()
    def sample(
        self,
        n: int,
        *,
        lengths: Sequence[int],
        temperature: float = 1.0,
        seed: int = 0,
        advantages: Sequence[float] | None = None,
    ) -> list[Part]:
        """``n`` Parts with responses of the given lengths, sampled with the current weights."""
        g = torch.Generator().manual_seed(seed)
        table = self._logp_table(temperature)
        params = ARSamplingParams(max_new_tokens=max(lengths), temperature=temperature)
        parts = []
        for b in range(n):
            prev = int(torch.randint(self.vocab, (1,), generator=g))
            prompt, resp, lps = [prev], [], []
            for _ in range(lengths[b]):
                tok = int(torch.multinomial(table[prev].exp(), 1, generator=g))
                resp.append(tok)
                lps.append(float(table[prev, tok]))
                prev = tok
            seg = TextSegment(
                prompt_ids=prompt,
                response_ids=resp,
                log_probs=torch.tensor(lps, dtype=torch.float32),
                loss_mask=torch.ones(len(resp), dtype=torch.bool),
                finish_reason="stop",
            )
            adv = None if advantages is None else float(advantages[b])
            parts.append(
                Part(name="ar", segment=seg, sampling_params=params, advantage=adv, status="completed")
            )
        return parts


def check_stage_algorithm(
    algorithm: StageAlgorithm, parts: Sequence[Part], pipeline: object, totals: BatchTotals
) -> None:
    """Contract every StageAlgorithm (fakes included) passes: it satisfies the protocol, and
    ``prepare`` (under no_grad) then ``loss`` give a finite 0-dim loss with a gradient and finite
    float metrics. Raises TypeError / ValueError describing the first violation."""
    if not isinstance(algorithm, StageAlgorithm):
        raise TypeError(f"{type(algorithm).__name__} does not satisfy the StageAlgorithm protocol")
    with torch.no_grad():
        algorithm.prepare(parts, pipeline)
    loss, metrics = algorithm.loss(parts, pipeline, totals)
    if loss.dim() != 0 or not torch.isfinite(loss) or not loss.requires_grad:
        raise ValueError(f"{algorithm.name}: loss must be a finite 0-dim tensor with grad, got {loss}")
    bad = {k: v for k, v in metrics.items() if not isinstance(v, float) or not math.isfinite(v)}
    if bad:
        raise ValueError(f"{algorithm.name}: metrics must be finite floats, got {bad}")
