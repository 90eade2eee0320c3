"""Aggregation modes with global denominators, and micro-batch invariance of value and gradient."""

import pytest
import torch

from unirl.train.algorithms.losses.aggregation import AGGREGATION_MODES, aggregate
from unirl.train.algorithms.losses.drpo import drpo_token_loss
from unirl.train.algorithms.losses.gspo import gspo_sequence_loss
from unirl.train.algorithms.losses.ppo import ppo_token_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 2.5),  # (1 + 2 + 3 + 4) / 4 tokens
        ("seq-mean-token-mean", 3.0),  # (6/3 + 4/1) / 2 seqs
        ("seq-mean-token-sum", 5.0),  # (6 + 4) / 2 seqs
        ("seq-mean-token-sum-norm", 1.25),  # (6 + 4) / (2 seqs * H=4)
    ],
)
def test_aggregation_worked(mode, expected):
    out = aggregate(LOSS, MASK, mode, num_tokens=4, num_samples=2, horizon=4)
    assert abs(out.item() - expected) < 1e-7
    # per-row shares with the same global totals add up to the full value
    rows = sum(
        aggregate(LOSS[i : i + 1], MASK[i : i + 1], mode, num_tokens=4, num_samples=2, horizon=4)
        for i in range(2)
    )
    assert abs(rows.item() - expected) < 1e-7


def test_aggregation_errors():
    with pytest.raises(ValueError, match="horizon"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm", num_tokens=4, num_samples=2)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(LOSS, MASK, "mean", num_tokens=4, num_samples=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        aggregate(LOSS, MASK[:, :2], "token-mean", num_tokens=4, num_samples=2)


def _batch(seed=0, b=8, t=7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    old_logprobs = -torch.rand(b, t, generator=g) * 3
    logp = old_logprobs + 0.3 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    return logp, old_logprobs, adv, mask, lengths


def _token_losses(kind, logp, old_logprobs, adv, mask):
    if kind == "ppo":
        return ppo_token_loss(logp, old_logprobs, adv, 0.2, 0.28, 3.0)[0]
    if kind == "drpo":
        return drpo_token_loss(logp, old_logprobs, adv)[0]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["ppo", "drpo"])
@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_micro_batch_invariance_1x8_vs_8x1(kind, mode):
    logp, old_logprobs, adv, mask, lengths = _batch()
    totals = {"num_tokens": int(mask.sum()), "num_samples": 8, "horizon": 7}
    full_logp = logp.clone().requires_grad_(True)
    full = aggregate(_token_losses(kind, full_logp, old_logprobs, adv, mask), mask, mode, **totals)
    full.backward()

    micro_logp = logp.clone().requires_grad_(True)
    total = torch.zeros(())
    for i in range(8):
        n = int(lengths[i])  # each micro-batch is padded only to its own length
        lp = micro_logp[i : i + 1, :n]
        part = aggregate(
            _token_losses(kind, lp, old_logprobs[i : i + 1, :n], adv[i : i + 1], mask[i : i + 1, :n]),
            mask[i : i + 1, :n],
            mode,
            **totals,
        )
        part.backward()
        total = total + part.detach()
    assert abs(total.item() - full.item()) < 1e-6
    torch.testing.assert_close(micro_logp.grad, full_logp.grad, atol=1e-6, rtol=0)


def test_gspo_micro_batch_invariance():
    logp, old_logprobs, adv, mask, lengths = _batch(seed=1)
    full_logp = logp.clone().requires_grad_(True)
    full = gspo_sequence_loss(full_logp, old_logprobs, adv, mask, 3e-4, 4e-4)[0].sum() / 8
    full.backward()
    micro_logp = logp.clone().requires_grad_(True)
    total = 0.0
    for i in range(8):
        n = int(lengths[i])
        part = (
            gspo_sequence_loss(
                micro_logp[i : i + 1, :n],
                old_logprobs[i : i + 1, :n],
                adv[i : i + 1],
                mask[i : i + 1, :n],
                3e-4,
                4e-4,
            )[0].sum()
            / 8
        )
        part.backward()
        total += part.item()
    assert abs(total - full.item()) < 1e-6
    torch.testing.assert_close(micro_logp.grad, full_logp.grad, atol=1e-6, rtol=0)
