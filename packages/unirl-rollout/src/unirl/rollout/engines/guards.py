"""Guards at the engine boundary: sigma echo, log-prob parity and weight stamps.

A dedicated engine samples with its own copy of the model and its own kernels, so what it reports
is checked where it enters the trainer (CONVENTIONS: check every cross-process boundary):

- :func:`check_sigma_echo`: the sigmas the engine says it used must equal the schedule the driver
  pinned (REFERENCE_MATH: rollout and replay use the same T+1 values). A mismatch is an error,
  never a warning: replaying other sigmas silently trains on the wrong transition.
- :func:`logprob_parity`: the engine's behaviour log-probs against the trainer's replay of the
  same tokens / transitions. Pure and engine independent (LLM tokens or diffusion SDE steps).
- :func:`weight_stamp` / :func:`check_weight_stamp`: the stamp over the tensors a receiver got,
  compared with the trainer's (the weight plane's own, ``unirl.distributed.weightsync.engine``,
  re-exported here for the engines that check it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from unirl.distributed.weightsync.engine import StampMismatchError, check_weight_stamp, weight_stamp

__all__ = [
    "LogProbParityError",
    "SigmaEchoError",
    "StampMismatchError",
    "check_sigma_echo",
    "check_weight_stamp",
    "logprob_parity",
    "weight_stamp",
]


class SigmaEchoError(ValueError):
    """An engine used (or reports) a sigma schedule other than the pinned one."""


class LogProbParityError(ValueError):
    """Engine and trainer log-probs of the same samples differ by more than the bound."""


def check_sigma_echo(
    sample_id: str,
    pinned: Sequence[float],
    echoed: Sequence[float],
    *,
    atol: float = 1e-6,
    rtol: float = 1e-5,
) -> float:
    """Raise SigmaEchoError unless ``echoed`` equals ``pinned`` elementwise (allclose).

    Both must hold the T + 1 values of the schedule. Returns the max absolute deviation (0.0 for an
    exact echo). The default tolerance admits float32 round-off of a float64 schedule
    (~6e-8 relative), not a different shift (SD3 shift 3 vs 1 differs by up to 0.5).
    """
    p, e = [float(x) for x in pinned], [float(x) for x in echoed]
    if len(p) != len(e):
        raise SigmaEchoError(
            f"sample {sample_id!r}: engine echoed {len(e)} sigmas, the pinned schedule has {len(p)} "
            f"(num_steps={len(p) - 1}); the engine ran a different number of steps"
        )
    if not all(math.isfinite(x) for x in e):
        raise SigmaEchoError(f"sample {sample_id!r}: engine echoed non-finite sigmas {e}")
    dev = [abs(a - b) for a, b in zip(p, e)]
    worst = max(range(len(dev)), key=dev.__getitem__)
    bad = [i for i, (a, b) in enumerate(zip(p, e)) if abs(a - b) > atol + rtol * abs(a)]
    if bad:
        raise SigmaEchoError(
            f"sample {sample_id!r}: engine sigmas differ from the pinned schedule at steps {bad[:8]}; "
            f"max deviation {dev[worst]:.3g} at step {worst} (pinned {p[worst]!r}, engine {e[worst]!r}); "
            f"tolerance atol={atol:g}, rtol={rtol:g}. The engine ignored the pinned sigmas (check that it "
            "receives them, its shift / dynamic-shift setting and its scheduler)"
        )
    return dev[worst]


def _rows(x: Tensor | Sequence[Any]) -> list[Tensor]:
    if isinstance(x, Tensor):
        return list(x.detach().float().cpu()) if x.dim() == 2 else [x.detach().float().cpu().reshape(-1)]
    return [torch.as_tensor(r, dtype=torch.float32).detach().cpu().reshape(-1) for r in x]


def logprob_parity(
    engine_logp: Tensor | Sequence[Any],
    replay_logp: Tensor | Sequence[Any],
    mask: Tensor | Sequence[Any] | None = None,
    *,
    max_abs_bound: float | None = None,
    sample_ids: Sequence[str] | None = None,
) -> dict[str, float]:
    """Compare engine log-probs with the trainer's replay of the same samples.

    Inputs are ``[B, T]`` tensors or ragged lists of ``B`` 1-D rows (token log-probs of each
    response, or per-SDE-step log-probs of each trajectory); ``mask`` (same layout, bool) keeps the
    positions to compare (default: all). Returns ``parity/max_abs_diff``, ``parity/mean_abs_diff``
    and ``parity/count`` (compared positions). Raises LogProbParityError naming the sample and
    position of the largest difference when it exceeds ``max_abs_bound`` (None: never raise), and
    when either side is not finite at a compared position.
    """
    eng, rep = _rows(engine_logp), _rows(replay_logp)
    if len(eng) != len(rep):
        raise ValueError(f"logprob_parity: {len(eng)} engine rows vs {len(rep)} replay rows")
    masks = _rows(mask) if mask is not None else [torch.ones_like(r) for r in eng]
    ids = list(sample_ids) if sample_ids is not None else [str(i) for i in range(len(eng))]
    total, count = 0.0, 0
    worst = (-1.0, "", -1)
    for b, (e, r, m) in enumerate(zip(eng, rep, masks)):
        if e.shape != r.shape or m.shape != e.shape:
            raise ValueError(
                f"logprob_parity: sample {ids[b]!r} has {e.numel()} engine, {r.numel()} replay and "
                f"{m.numel()} mask positions; they must match"
            )
        keep = m.bool()
        d = (e - r).abs()[keep]
        if not torch.isfinite(d).all():
            pos = int(torch.nonzero(keep)[~torch.isfinite(d)][0])
            raise LogProbParityError(
                f"sample {ids[b]!r}: non-finite log-prob at position {pos} (engine {float(e[pos])}, "
                f"replay {float(r[pos])})"
            )
        if d.numel():
            total += float(d.sum())
            count += d.numel()
            i = int(d.argmax())
            if float(d[i]) > worst[0]:
                worst = (float(d[i]), ids[b], int(torch.nonzero(keep)[i]))
    max_abs = max(worst[0], 0.0)
    metrics = {
        "parity/max_abs_diff": max_abs,
        "parity/mean_abs_diff": total / count if count else 0.0,
        "parity/count": float(count),
    }
    if max_abs_bound is not None and max_abs > max_abs_bound:
        raise LogProbParityError(
            f"engine vs trainer log-probs differ by {max_abs:.4g} (> bound {max_abs_bound:g}) at sample "
            f"{worst[1]!r} position {worst[2]}; mean |diff| {metrics['parity/mean_abs_diff']:.3g} over "
            f"{count} positions. The engine samples from another policy than the trainer replays: check "
            "the weight sync, temperature, dtype and (diffusion) sigmas / eta / guidance"
        )
    return metrics
