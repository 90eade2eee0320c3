"""Arithmetic word problems: seeded, templated, integer answers, disjoint train / held-out.

A problem is an English story ("Mia has 7 apples. She buys 5 more. How many apples does Mia
have now?"), its integer answer (12) and a worked solution ("7 + 5 = 12\\n#### 12") usable as
an SFT target. Kinds (``level`` groups them by the number of operations):

| kind | level | story | answer |
|---|---|---|---|
| add | 0 | has a, buys b more | a + b |
| sub | 0 | had a, gives b away (b <= a) | a - b |
| mul | 1 | a boxes of b each | a * b |
| div | 1 | shares a*b equally among b friends | a |
| add_sub | 2 | has a, buys b, gives c away (c <= a + b) | a + b - c |
| change | 2 | b items at a dollars each, pays c (c >= a*b) | c - a * b |

The split is a keyed hash of the *skeleton* (kind and numbers), not of the surface text, so a
held-out problem never shares its numbers-and-story with a training problem under another
name or object; it is independent of the sampling seed and of which levels are on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

Split = Literal["train", "held_out"]

NAMES: tuple[tuple[str, str], ...] = (
    ("Mia", "She"),
    ("Liam", "He"),
    ("Ava", "She"),
    ("Noah", "He"),
    ("Zoe", "She"),
    ("Omar", "He"),
    ("Lena", "She"),
    ("Ravi", "He"),
)
OBJECTS: tuple[str, ...] = ("apples", "marbles", "stickers", "pencils", "cookies", "cards", "shells")
ITEMS: tuple[str, ...] = ("notebook", "toy car", "sandwich", "ticket", "plant")


@dataclass(frozen=True)
class WordProblem:
    """One problem: the story ``prompt``, integer ``answer``, worked ``solution``, ``kind``, ``level``."""

    prompt: str
    answer: int
    solution: str
    kind: str
    level: int
    skeleton: str

    @property
    def target(self) -> str:
        """The reference answer as text (what exact-match scorers compare with)."""
        return str(self.answer)


Story = tuple[str, int, str]  # (prompt, answer, solution)


def _add(n: tuple[int, ...], who: str, pron: str, obj: str, item: str) -> Story:
    a, b = n[0], n[1]
    return (
        f"{who} has {a} {obj}. {pron} buys {b} more. How many {obj} does {who} have now?",
        a + b,
        f"{a} + {b} = {a + b}",
    )


def _sub(n: tuple[int, ...], who: str, pron: str, obj: str, item: str) -> Story:
    a, b = n[0], n[1]
    return (
        f"{who} had {a} {obj} and gave {b} of them to a friend. How many {obj} does {who} have left?",
        a - b,
        f"{a} - {b} = {a - b}",
    )


def _mul(n: tuple[int, ...], who: str, pron: str, obj: str, item: str) -> Story:
    a, b = n[0], n[1]
    return (
        f"{who} buys {a} boxes of {obj}. Each box holds {b} {obj}. How many {obj} does {who} buy in total?",
        a * b,
        f"{a} * {b} = {a * b}",
    )


def _div(n: tuple[int, ...], who: str, pron: str, obj: str, item: str) -> Story:
    a, b = n[0], n[1]
    return (
        f"{who} shares {a * b} {obj} equally among {b} friends. How many {obj} does each friend get?",
        a,
        f"{a * b} / {b} = {a}",
    )


def _add_sub(n: tuple[int, ...], who: str, pron: str, obj: str, item: str) -> Story:
    a, b, c = n
    return (
        f"{who} has {a} {obj}. {pron} buys {b} more and then gives {c} away. How many {obj} does {who} have now?",
        a + b - c,
        f"{a} + {b} = {a + b}, {a + b} - {c} = {a + b - c}",
    )


def _change(n: tuple[int, ...], who: str, pron: str, obj: str, item: str) -> Story:
    a, b, c = n
    return (
        f"A {item} costs {a} dollars. {who} buys {b} of them and pays with {c} dollars. "
        f"How many dollars of change does {who} get?",
        c - a * b,
        f"{b} * {a} = {a * b}, {c} - {a * b} = {c - a * b}",
    )


def _draw_numbers(kind: str, rng: np.random.Generator, hi: int) -> tuple[int, ...]:
    """Operands of a kind, within ``1..hi`` (products capped at ``hi`` for mul/div factors <= 12)."""

    def r(lo: int, top: int) -> int:
        return int(rng.integers(lo, max(lo, top) + 1))

    if kind == "add":
        return (r(2, hi), r(1, hi))
    if kind == "sub":
        a = r(2, hi)
        return (a, r(1, a))
    if kind in ("mul", "div"):
        return (r(2, min(12, hi)), r(2, min(12, hi)))
    if kind == "add_sub":
        a, b = r(2, hi), r(1, hi)
        return (a, b, r(1, a + b))
    if kind == "change":
        a, b = r(1, min(12, hi)), r(2, 6)
        return (a, b, a * b + r(0, hi))
    raise ValueError(f"kind={kind!r}: allowed {sorted(KINDS)}")


KINDS: dict[str, tuple[int, Callable[..., Story]]] = {
    "add": (0, _add),
    "sub": (0, _sub),
    "mul": (1, _mul),
    "div": (1, _div),
    "add_sub": (2, _add_sub),
    "change": (2, _change),
}


@dataclass(frozen=True)
class WordProblemsConfig:
    """levels: which levels (0..2) to draw from, uniformly by kind; max_operand: largest
    additive operand; held_out_fraction: of skeletons; split_key: salt of the split hash."""

    levels: tuple[int, ...] = (0, 1, 2)
    max_operand: int = 20
    held_out_fraction: float = 0.2
    split_key: str = "unirl-word-problems-v1"

    def __post_init__(self) -> None:
        known = sorted({lv for lv, _ in KINDS.values()})
        if not self.levels or any(lv not in known for lv in self.levels):
            raise ValueError(f"levels={self.levels!r}: each must be one of {known}")
        if self.max_operand < 2:
            raise ValueError(f"max_operand={self.max_operand}: must be >= 2")
        if not 0.0 < self.held_out_fraction < 1.0:
            raise ValueError(f"held_out_fraction={self.held_out_fraction}: must be in (0, 1)")


def make_problem(kind: str, numbers: tuple[int, ...], rng: np.random.Generator) -> WordProblem:
    """The problem of ``kind`` with ``numbers``; ``rng`` picks only the surface (name, object)."""
    level, story = KINDS[kind]
    who, pron = NAMES[int(rng.integers(len(NAMES)))]
    obj = OBJECTS[int(rng.integers(len(OBJECTS)))]
    item = ITEMS[int(rng.integers(len(ITEMS)))]
    prompt, answer, work = story(numbers, who, pron, obj, item)
    skeleton = f"{kind}:{','.join(map(str, numbers))}"
    return WordProblem(prompt, answer, f"{work}\n#### {answer}", kind, level, skeleton)


class WordProblemsWorld:
    """Seeded sampler of word problems with a skeleton-hash disjoint split."""

    def __init__(self, config: WordProblemsConfig | None = None) -> None:
        self.config = config or WordProblemsConfig()
        self.kinds = [k for k, (lv, _) in KINDS.items() if lv in self.config.levels]

    def split_of(self, skeleton: str) -> Split:
        """'held_out' for a fixed fraction of skeletons (keyed SHA-256), else 'train'."""
        digest = hashlib.sha256(f"{self.config.split_key}:{skeleton}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        return "held_out" if u < self.config.held_out_fraction else "train"

    def sample(self, n: int, seed: int, split: Split = "train", *, unique: bool = False) -> list[WordProblem]:
        """``n`` problems of ``split``: a kind uniformly, then operands and surface (rejection on split).

        ``unique=True`` skips repeated skeletons; raises ``ValueError`` if the split runs out.
        """
        if split not in ("train", "held_out"):
            raise ValueError(f"split={split!r}: allowed 'train', 'held_out'")
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        out: list[WordProblem] = []
        seen: set[str] = set()
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > 200 * n + 10_000:
                raise ValueError(
                    f"could not draw {n} {'unique ' if unique else ''}{split} problems; "
                    f"raise max_operand={self.config.max_operand} or enable more levels"
                )
            kind = self.kinds[int(rng.integers(len(self.kinds)))]
            p = make_problem(kind, _draw_numbers(kind, rng, self.config.max_operand), rng)
            if self.split_of(p.skeleton) != split or (unique and p.skeleton in seen):
                continue
            seen.add(p.skeleton)
            out.append(p)
        return out
