"""DAPO reward shaping, dynamic-sampling filter, decoupled-PPO importance weights, token NLL."""

import math

import pytest
import torch

from unirl.train.algorithms.losses.dapo import group_has_signal, overlong_penalty, shape_reward
from unirl.train.algorithms.losses.off_policy import decoupled_weight
from unirl.train.algorithms.losses.token_sft import token_nll


def test_overlong_penalty_worked():
    # L = 20, B = 5: no penalty up to 15 tokens, then -(len - 15)/5 * factor
    assert overlong_penalty(10, 20, 5) == 0.0
    assert overlong_penalty(15, 20, 5) == 0.0
    assert abs(overlong_penalty(17, 20, 5) - (-0.4)) < 1e-12
    assert overlong_penalty(20, 20, 5) == -1.0
    assert abs(overlong_penalty(18, 20, 5, factor=2.0) - (-1.2)) < 1e-12
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(1, 20, 0)


def test_truncation_policies():
    kw = {"max_length": 20, "buffer": 5}
    assert shape_reward(1.0, 20, True, "zero", **kw) == 0.0
    assert shape_reward(1.0, 12, False, "zero", **kw) == 1.0
    assert shape_reward(1.0, 20, True, "keep", **kw) == 1.0
    assert shape_reward(1.0, 20, True, "soft", **kw) == 0.0  # 1 + (-1)
    assert abs(shape_reward(1.0, 17, False, "soft", **kw) - 0.6) < 1e-12
    with pytest.raises(ValueError, match="soft"):
        shape_reward(1.0, 1, False, "drop", **kw)  # type: ignore[arg-type]


def test_dynamic_sampling_filter():
    assert not group_has_signal([1.0, 1.0, 1.0])
    assert group_has_signal([0.0, 1.0])
    assert not group_has_signal([1.0])
    with pytest.raises(ValueError, match="non-finite"):
        group_has_signal([0.0, math.nan])


def test_decoupled_weight_truncate_and_mask():
    # behaviour logp 0, proximal logp ln w with w = [2, 0.5, 10, 3]; the last token is padding
    old_logprobs = torch.log(torch.tensor([[2.0, 0.5, 10.0, 3.0]]))
    behavior_logprobs = torch.zeros(1, 4)
    mask = torch.tensor([[1, 1, 1, 0]])
    # truncated IS, C = 5: [2, 0.5, min(10, 5), 0 (padding)]
    w = decoupled_weight(old_logprobs, behavior_logprobs, mask, "truncate", cap=5.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 5.0, 0.0]]))
    # mask to [0.6, 4]: only 2 is inside -> [1, 0, 0, 0]
    w = decoupled_weight(old_logprobs, behavior_logprobs, mask, "mask", c_min=0.6, c_max=4.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    # sequence level: exp(ln 2 + ln 0.5 + ln 10) = 10 for every token, truncated to 5
    w = decoupled_weight(old_logprobs, behavior_logprobs, mask, "truncate", cap=5.0, level="sequence")
    torch.testing.assert_close(w, torch.tensor([[5.0, 5.0, 5.0, 0.0]]))
    with pytest.raises(ValueError, match="cap"):
        decoupled_weight(old_logprobs, behavior_logprobs, mask, "truncate")
    with pytest.raises(ValueError, match="c_min"):
        decoupled_weight(old_logprobs, behavior_logprobs, mask, "mask", c_min=2.0, c_max=1.0)


def test_token_nll():
    torch.testing.assert_close(
        token_nll(torch.log(torch.tensor([0.5, 1.0]))), torch.tensor([math.log(2), 0.0])
    )
