"""math-verify scorer and the per-sample timeout (a real child process, really killed)."""

from __future__ import annotations

import time

import pytest

from unirl.reward._sandbox import IsolatedRunner
from unirl.reward.protocol import ScoreItem
from unirl.reward.rules.math import MathVerifyScorer, verify_answer
from unirl.reward.testing import ScorerContract


@pytest.mark.parametrize(
    ("response", "reference", "ok"),
    [
        (r"The answer is $\boxed{\frac{1}{2}}$.", "0.5", True),
        (r"$\boxed{2\sqrt{2}}$", r"\sqrt{8}", True),  # sqrt(8) = 2 sqrt(2)
        ("So x = 3.", "3", True),
        (r"$\boxed{3}$", "4", False),
        ("", "4", False),
        (r"}}}\frac{{{\boxed{", "1", False),  # malformed model output: wrong, not a crash
    ],
)
def test_verify_answer(response, reference, ok):
    assert verify_answer(response, reference) is ok


def test_runner_timeout_kills_and_recovers():
    runner = IsolatedRunner("time:sleep", timeout_s=0.5)
    try:
        t0 = time.monotonic()
        assert runner.call([30], default="timed out") == "timed out"
        assert time.monotonic() - t0 < 5  # bounded by the timeout, not the 30 s sleep
        assert runner.timeouts == 1
        assert runner.call([0], default="timed out") is None  # a fresh child answers
        assert runner.call(["not a number"], default="err") == "err"  # an exception -> default
    finally:
        runner.close()


@pytest.fixture(scope="module")
def math_scorer():
    s = MathVerifyScorer(timeout_s=10.0)
    yield s
    s.close()


class TestMathVerifyContract(ScorerContract):
    @pytest.fixture
    def scorer(self, math_scorer):
        return math_scorer

    @pytest.fixture
    def items(self):
        return [
            ScoreItem(response=r"\boxed{\frac{3}{4}}", reference="0.75"),
            ScoreItem(response="12", reference="13"),
        ]

    def test_worked(self, scorer, items):
        assert [r.total for r in scorer.score(items)] == [1.0, 0.0]


def test_scorer_works_from_a_worker_thread(math_scorer):
    # math-verify's own timeouts use signal.alarm (main thread only); ours must work in a server thread.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        res = pool.submit(math_scorer.score, [ScoreItem(response="#### 72", reference="72")]).result(
            timeout=60
        )
    assert res[0].total == 1.0


@pytest.mark.slow
def test_hostile_answer_times_out_as_wrong():
    # 9^9^9^9^9 makes sympy evaluate a tower it never finishes: without the bound this hangs (> 60 s).
    s = MathVerifyScorer(timeout_s=1.0, eager_start=True)
    try:
        t0 = time.monotonic()
        res = s.score(
            [
                ScoreItem(response=r"\boxed{9^{9^{9^{9^{9}}}}}", reference="2"),
                ScoreItem(response=r"\boxed{2}", reference="2"),
            ]
        )
        assert [r.total for r in res] == [0.0, 1.0]  # the next sample is scored by a fresh child
        assert s.timeouts == 1
        assert time.monotonic() - t0 < 45  # 1 s bound + one child restart, not the hang
    finally:
        s.close()
