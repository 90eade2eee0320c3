"""The arithmetic world: seeded integer problems of graded difficulty, disjoint train / held-out.

A problem is a prompt such as ``"12+7="`` and its integer answer (``19``); the SFT target is the
answer's decimal text. Difficulty levels (operands inclusive):

| level | form | operands |
|---|---|---|
| 0 | a+b | a, b in 0..9 |
| 1 | a+b | a in 10..99, b in 0..9 |
| 2 | a-b | a in 0..99, b in 0..a (answer >= 0) |
| 3 | a+b | a, b in 10..99 |
| 4 | a*b | a, b in 0..9 |
| 5 | a*b | a in 10..99, b in 0..9 |

The split is a pure function of the prompt text (a keyed hash), so a held-out prompt is never a
training prompt under any sampling seed, and the split does not depend on which levels are on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from unirl.reward.worlds.arithmetic_checker import ArithmeticCheck, check_answer

Split = Literal["train", "held_out", "all"]

# level -> (operator, (a_lo, a_hi), (b_lo, b_hi) or None meaning 0..a)
LEVELS: dict[int, tuple[str, tuple[int, int], tuple[int, int] | None]] = {
    0: ("+", (0, 9), (0, 9)),
    1: ("+", (10, 99), (0, 9)),
    2: ("-", (0, 99), None),
    3: ("+", (10, 99), (10, 99)),
    4: ("*", (0, 9), (0, 9)),
    5: ("*", (10, 99), (0, 9)),
}


@dataclass(frozen=True)
class ArithmeticProblem:
    """One problem: `prompt` (e.g. "12+7="), integer `answer`, difficulty `level`."""

    prompt: str
    answer: int
    level: int

    @property
    def target(self) -> str:
        """The SFT completion: the answer's decimal text."""
        return str(self.answer)

    def check(self, completion: str) -> ArithmeticCheck:
        return check_answer(completion, self.answer)


@dataclass(frozen=True)
class ArithmeticWorldConfig:
    """levels: which difficulty levels to draw from (uniformly); held_out_fraction: of each level's
    problems; split_key: salt of the split hash (change it for a different, still disjoint, split)."""

    levels: tuple[int, ...] = (0, 1, 2, 4)
    held_out_fraction: float = 0.2
    split_key: str = "unirl-arithmetic-v1"

    def __post_init__(self) -> None:
        bad = [lv for lv in self.levels if lv not in LEVELS]
        if bad or not self.levels:
            raise ValueError(f"levels={self.levels!r}: each must be one of {sorted(LEVELS)}")
        if not 0.0 < self.held_out_fraction < 1.0:
            raise ValueError(f"held_out_fraction={self.held_out_fraction}: must be in (0, 1)")


def _make(level: int, a: int, b: int) -> ArithmeticProblem:
    op = LEVELS[level][0]
    answer = a + b if op == "+" else a - b if op == "-" else a * b
    return ArithmeticProblem(prompt=f"{a}{op}{b}=", answer=answer, level=level)


def level_problems(level: int) -> Iterator[ArithmeticProblem]:
    """Every problem of a level, in a fixed order."""
    _, (alo, ahi), brange = LEVELS[level]
    for a in range(alo, ahi + 1):
        blo, bhi = brange if brange is not None else (0, a)
        for b in range(blo, bhi + 1):
            yield _make(level, a, b)


class ArithmeticWorld:
    """Seeded sampler of arithmetic problems with a hash-defined disjoint split."""

    def __init__(self, config: ArithmeticWorldConfig | None = None) -> None:
        self.config = config or ArithmeticWorldConfig()
        self._by_split: dict[str, list[ArithmeticProblem]] = {"train": [], "held_out": []}
        for level in self.config.levels:
            for p in level_problems(level):
                self._by_split[self.split_of(p.prompt)].append(p)

    def split_of(self, prompt: str) -> Literal["train", "held_out"]:
        """'held_out' for a fixed held_out_fraction of prompts (keyed SHA-256), else 'train'."""
        digest = hashlib.sha256(f"{self.config.split_key}:{prompt}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        return "held_out" if u < self.config.held_out_fraction else "train"

    def problems(self, split: Split) -> list[ArithmeticProblem]:
        """All problems of a split over the configured levels, in a fixed order."""
        if split == "all":
            return self._by_split["train"] + self._by_split["held_out"]
        if split not in self._by_split:
            raise ValueError(f"split={split!r}: allowed 'train', 'held_out', 'all'")
        return list(self._by_split[split])

    def sample(self, n: int, seed: int, split: Split = "train") -> list[ArithmeticProblem]:
        """`n` problems: a level uniformly from config.levels, then a problem uniformly within it."""
        rng = np.random.default_rng(seed)
        pool = self.problems(split)
        by_level: dict[int, list[ArithmeticProblem]] = {}
        for p in pool:
            by_level.setdefault(p.level, []).append(p)
        levels = sorted(by_level)
        out = []
        for _ in range(n):
            group = by_level[levels[int(rng.integers(len(levels)))]]
            out.append(group[int(rng.integers(len(group)))])
        return out
