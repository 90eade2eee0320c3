"""KL estimators k1, k2, k3, k3+: values and gradients with worked numbers."""

import math

import pytest
import torch

from unirl.train.algorithms.losses.kl import kl_estimate

# d = logp - logp_ref.
#            d = 0.5                                   d = -1
# k1  value  0.5                 grad 1                -1           grad 1
# k2  value  0.125               grad d = 0.5          0.5          grad -1
# k3  value  e^-0.5 - 0.5 = 0.1065307  grad 1 - e^-d = 0.3934693   e - 2 = 0.7182818   grad 1 - e = -1.7182818
# k3+ value  (k3) 0.1065307      grad (k2) 0.5         0.7182818    grad -1
CASES = {
    "k1": ([0.5, -1.0], [1.0, 1.0]),
    "k2": ([0.125, 0.5], [0.5, -1.0]),
    "k3": ([math.exp(-0.5) - 0.5, math.e - 2], [1 - math.exp(-0.5), 1 - math.e]),
    "k3+": ([math.exp(-0.5) - 0.5, math.e - 2], [0.5, -1.0]),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_kl_estimator_values_and_gradients(kind):
    values, grads = CASES[kind]
    logp = torch.tensor([0.5, -1.0], requires_grad=True)
    ref = torch.zeros(2, requires_grad=True)
    kl = kl_estimate(logp, ref, kind)
    torch.testing.assert_close(kl, torch.tensor(values))
    kl.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor(grads))
    assert ref.grad is None


def test_k3_is_clamped_and_unknown_kind_rejected():
    # d = -30 -> clamp to -20 -> e^20 - 21 -> clamp the value to 10
    assert kl_estimate(torch.tensor([-30.0]), torch.zeros(1), "k3").item() == 10.0
    with pytest.raises(ValueError, match="k3\\+"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")  # type: ignore[arg-type]
