"""The shapes visual-question world: answers read back from the pixels, disjoint held-out scenes,
image inputs on the Samples, and (slow) a shortened SFT -> GRPO run whose held-out accuracy rises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unirl.apps.loop import make_samples
from unirl.apps.worlds.shapes_vqa import ShapesVQAConfig, VQAExample, make_example
from unirl.reward.worlds.shapes_spec import PALETTE
from unirl.types import ImagePrimitive, to_torch


def answer_from_pixels(e: VQAExample, cell: int) -> str:
    """Read the scene back from the image alone: each object's colour at its centre, its shape from
    its box corner (a square fills it, a circle leaves it black); then answer the question."""
    found = []
    for o in e.objects:
        cy, cx = o.y + o.size // 2, o.x + o.size // 2
        colour = next(k for k, v in PALETTE.items() if tuple(e.image[cy, cx]) == v)
        shape = "square" if e.image[o.y, o.x].any() else "circle"
        found.append((colour, shape))
    words = e.question.rstrip("?").split()
    if e.kind == "colour":
        return next(c for c, s in found if s == words[-1])
    colour, shape = words[2], words[3][:-1]
    return str(sum(f == (colour, shape) for f in found))


def test_answers_match_what_the_image_shows() -> None:
    cfg = ShapesVQAConfig()
    examples = [make_example(cfg, np.random.default_rng([5, i])) for i in range(300)]
    assert all(e.image.shape == (32, 32, 3) and e.image.dtype == np.uint8 for e in examples)
    assert all(answer_from_pixels(e, 8) == e.answer for e in examples)
    kinds = {k: [e for e in examples if e.kind == k] for k in ("count", "colour")}
    assert 0.2 < len(kinds["colour"]) / len(examples) < 0.5
    counts = {e.answer for e in kinds["count"]}
    assert {"0", "1", "2"} <= counts  # "0" is a real answer: the asked pair is absent
    # the image is not redundant with the question: the same question has several answers
    by_q: dict[str, set[str]] = {}
    for e in examples:
        by_q.setdefault(e.question, set()).add(e.answer)
    assert all(len(a) >= 2 for q, a in by_q.items() if len([e for e in examples if e.question == q]) >= 10)


def test_held_out_scenes_never_appear_in_training() -> None:
    src = ShapesVQAConfig(num_train=300, num_eval=100).build()
    held = {(r.prompt, r.images[0].tobytes()) for r in src.eval_records()}
    train = {(r.prompt, r.images[0].tobytes()) for r in src.train_records()}
    sft = {(r.prompt, r.images[0].tobytes()) for s in range(5) for r in src.sft_records(64, seed=0, step=s)}
    assert len(held) == 100 and not held & train and not held & sft
    a, b = src.sft_records(8, seed=0, step=3), src.sft_records(8, seed=0, step=3)
    assert [r.answer for r in a] == [r.answer for r in b] and all(
        np.array_equal(x.images[0], y.images[0]) for x, y in zip(a, b)
    )
    samples = make_samples(
        src.eval_records()[:2], step=0, samples_per_prompt=2, split="eval", dataset=src.name
    )
    img = samples[0].inputs[1]
    assert isinstance(img, ImagePrimitive) and np.array_equal(
        to_torch(img.pixels).numpy(), src.eval_records()[0].images[0]
    )
    assert samples[0].metadata.answer == src.eval_records()[0].answer


def test_sft_answer_noise_mislabels_only_sft_answers_within_their_kind() -> None:
    """With ``sft_answer_noise`` 0.3 about 0.3 x (1 - 1/|answers|) of SFT answers change (count: 5
    answers, colour: 3), each to an answer of its own kind; scenes, RL and held-out records do not."""
    clean = ShapesVQAConfig(num_train=50, num_eval=20).build()
    noisy = ShapesVQAConfig(num_train=50, num_eval=20, sft_answer_noise=0.3).build()
    a, b = clean.sft_records(3000, seed=0, step=1), noisy.sft_records(3000, seed=0, step=1)
    assert [(r.prompt, r.images[0].tobytes()) for r in a] == [(r.prompt, r.images[0].tobytes()) for r in b]
    pools = {"count": {"0", "1", "2", "3", "4"}, "colour": set(PALETTE)}
    for kind, expected in (("count", 0.3 * 4 / 5), ("colour", 0.3 * 2 / 3)):
        pairs = [(x.answer, y.answer) for x, y in zip(a, b) if x.spec["kind"] == kind]
        changed = sum(x != y for x, y in pairs) / len(pairs)
        assert abs(changed - expected) < 0.04, (kind, changed)
        assert {y for _, y in pairs} <= pools[kind]
    assert [r.answer for r in clean.train_records()] == [r.answer for r in noisy.train_records()]
    assert [r.answer for r in clean.eval_records()] == [r.answer for r in noisy.eval_records()]


VQA_SHORT = (
    "threads=1", "sft.steps=500", "rl.steps=30", "eval.num_prompts=100", "eval.every=0",
    "data.num_train=400", "data.num_eval=100",
)  # fmt: skip


@pytest.mark.slow
def test_shapes_vqa_grpo_short_run_learns(tmp_path: Path, eval_outcomes: Any) -> None:
    """A shortened shapes_vqa_grpo: SFT on noisy answers reads the image, then GRPO raises held-out
    per-sample accuracy (100 scenes x 4 sampled answers) by a paired-bootstrap 95% interval above 0."""
    from unirl.apps import cli
    from unirl.apps.evalstats import paired_bootstrap

    run = tmp_path / "run"
    assert cli.main(["train", "--run-dir", str(run), "shapes_vqa_grpo", *VQA_SHORT]) == 0
    ev = eval_outcomes(run)
    gain, lo, hi = paired_bootstrap(ev["sft"], ev["rl"])
    sft_acc = sum(map(sum, ev["sft"].values())) / sum(map(len, ev["sft"].values()))
    print(f"held-out accuracy: sft {sft_acc:.3f}, RL gain {gain:+.3f} ({lo:+.3f} to {hi:+.3f})")
    assert 0.25 < sft_acc < 0.8  # SFT leaves room for RL
    assert lo > 0.0, f"RL over SFT {gain * 100:+.1f} points, 95% interval {lo * 100:+.1f} to {hi * 100:+.1f}"
    assert (run / "report.md").is_file()
