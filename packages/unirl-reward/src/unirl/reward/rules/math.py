"""Math answer verification with the `math-verify` package (HuggingFace), bounded per sample.

`verify_answer(response, reference)` parses the gold answer and the response (LaTeX, boxed
answers, plain expressions) and checks mathematical equivalence (1/2 == 0.5 == \\frac{1}{2}).
The scorer runs it in an `IsolatedRunner` child so a pathological response costs at most
`timeout_s` and scores 0.0 ("wrong"), never a crash or a hung server.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from importlib.metadata import version as _dist_version

from unirl.reward._sandbox import IsolatedRunner
from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs

MAX_CHARS = 20_000


def verify_answer(response: str, reference: str) -> bool:
    """True when `response` contains an answer equivalent to `reference` (math-verify semantics).

    Runs without math-verify's own signal timeouts (the caller bounds time). Only the last
    `MAX_CHARS` characters of the response are read.
    """
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # silence "timeout disabled" notes
    gold = parse(reference, parsing_timeout=None)  # type: ignore[arg-type]  # None disables signals
    if not gold:
        gold = parse(f"${reference}$", parsing_timeout=None)  # type: ignore[arg-type]
    pred = parse(response[-MAX_CHARS:], parsing_timeout=None)  # type: ignore[arg-type]
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=None))


class MathVerifyScorer:
    """1.0 if the response's answer is equivalent to `item.reference`, else 0.0 (also on timeout)."""

    modality: Modality = "text"
    output_range = (0.0, 1.0)

    def __init__(self, timeout_s: float = 5.0, name: str = "math_verify", eager_start: bool = False) -> None:
        self.name = name
        self.version = f"1+math-verify{_dist_version('math-verify')}"
        self._runner = IsolatedRunner(
            "unirl.reward.rules.math:verify_answer", timeout_s=timeout_s, preload=("math_verify", "sympy")
        )
        if eager_start:  # pay the child's import time (sympy) now, not on the first request
            self._runner.call(["1", "1"], default=False)

    @property
    def timeouts(self) -> int:
        """How many samples hit the per-sample timeout so far."""
        return self._runner.timeouts

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        out = []
        for i, item in enumerate(items):
            if item.reference is None:
                raise ValueError(
                    f"scorer {self.name!r} needs item.reference (the gold answer); item {i} has none"
                )
            ok = self._runner.call([item.response or "", item.reference], default=False)
            out.append(ScoreResult(total=float(bool(ok))))
        return out

    def close(self) -> None:
        """Stop the verification child process."""
        self._runner.close()
