"""Prompt-enhancer lineage: children of a parent Part, reward crediting, per-part advantages."""

from __future__ import annotations

import numpy as np
import pytest

from unirl.types import AdvantageConfig, Part, Reward, Sample, TextPrimitive, compute_sample_advantages
from unirl.types.lineage import children_by_parent, credit_parents, expand_children


def _parents() -> list[Sample]:
    """Two prompts (groups gA, gB), two AR rewrites each."""
    out = []
    for g in ("gA", "gB"):
        for k in range(2):
            s = Sample(id=f"{g}/{k}", group_id=g, inputs=[TextPrimitive(text=f"user {g}")])
            s.parts.append(
                Part(
                    name="ar",
                    outputs=[TextPrimitive(text=f"rewrite {g}{k}")],
                    status="completed",
                    weight_version=3,
                )
            )
            out.append(s)
    return out


# child rewards per parent (M = 3 images per rewrite)
CHILD_REWARDS = {
    "gA/0": [1.0, 0.0, 0.5],
    "gA/1": [0.0, 0.0, 0.0],
    "gB/0": [1.0, 1.0, 0.7],
    "gB/1": [0.2, 0.4, 0.6],
}


def _rendered(parents: list[Sample]) -> list[Sample]:
    children = expand_children(parents, 3, "ar")
    for c in children:
        pid, j = c.id.rsplit("/c", 1)
        r = CHILD_REWARDS[pid][int(j)]
        c.parts.append(
            Part(
                name="diffusion",
                parent="ar",
                status="completed",
                reward=Reward(total=r, components={"geneval/count": r}),
            )
        )
    return children


def test_expand_children_lineage() -> None:
    parents = _parents()
    children = expand_children(parents, 3, "ar")
    assert [c.id for c in children[:3]] == ["gA/0/c0", "gA/0/c1", "gA/0/c2"]
    assert {c.group_id for c in children[:3]} == {"gA/0"}  # grouped by their parent (AR sample)
    c = children[4]
    assert c.group_id == "gA/1" and c.prompt == "user gA"  # the ORIGINAL prompt is kept
    assert c.part("ar").text == "rewrite gA1" and c.part("ar").weight_version == 3
    assert c.part("ar").segment is None  # only the parent trains on the AR segment
    c.parts.append(Part(name="diffusion", parent="ar"))
    Sample.model_validate(c.model_dump())  # a valid lineage: ar -> diffusion
    with pytest.raises(ValueError, match="at least one child"):
        expand_children(parents, 0, "ar")


@pytest.mark.parametrize(
    ("reduce", "expected"),
    [
        # gA/0: mean(1, 0, .5) = .5; gA/1: 0; gB/0: mean(1, 1, .7) = .9; gB/1: mean(.2, .4, .6) = .4
        ("mean", [0.5, 0.0, 0.9, 0.4]),
        ("max", [1.0, 0.0, 1.0, 0.6]),
        ("min", [0.0, 0.0, 0.7, 0.2]),
    ],
)
def test_credit_parents_worked(reduce: str, expected: list[float]) -> None:
    parents = _parents()
    children = _rendered(parents)
    got = credit_parents(parents, children, "ar", "diffusion", reduce)  # type: ignore[arg-type]
    np.testing.assert_allclose(got, expected, atol=1e-12)
    np.testing.assert_allclose([p.part("ar").reward.total for p in parents], expected, atol=1e-12)  # type: ignore[union-attr]
    comps = parents[2].part("ar").reward.components  # type: ignore[union-attr]
    assert comps["children_mean"] == pytest.approx(0.9) and comps["children_min"] == pytest.approx(0.7)
    assert comps["geneval/count"] == pytest.approx(expected[2])  # a shared component, reduced the same way


def test_per_part_advantages_worked() -> None:
    """AR advantages grouped by prompt, image advantages grouped by AR sample (population std, eps=0)."""
    parents = _parents()
    children = _rendered(parents)
    credit_parents(parents, children, "ar", "diffusion", "mean")
    cfg = AdvantageConfig(mode="group_zscore", eps=0.0)
    a_ar = compute_sample_advantages(parents, "ar", cfg)
    # gA: rewards (.5, 0): mean .25, pop std .25 -> (+1, -1); gB: (.9, .4): mean .65, std .25 -> (+1, -1)
    np.testing.assert_allclose(a_ar, [1.0, -1.0, 1.0, -1.0], atol=1e-12)
    a_img = compute_sample_advantages(children, "diffusion", cfg)
    # gA/0: (1, 0, .5): mean .5, pop std sqrt(1/6) = .408248 -> (1.224745, -1.224745, 0)
    # gA/1: all 0 -> 0 (zero variance); gB/0: (1, 1, .7): mean .9, std sqrt(.02) = .141421 -> (.707107, .707107, -1.414214)
    # gB/1: (.2, .4, .6): mean .4, std .163299 -> (-1.224745, 0, 1.224745)
    np.testing.assert_allclose(
        a_img,
        [1.224745, -1.224745, 0.0, 0, 0, 0, 0.707107, 0.707107, -1.414214, -1.224745, 0.0, 1.224745],
        atol=1e-6,
    )
    assert [c.part("diffusion").advantage for c in children[:3]] == pytest.approx(
        [1.224745, -1.224745, 0.0], abs=1e-6
    )


def test_credit_errors() -> None:
    parents = _parents()
    children = _rendered(parents)
    with pytest.raises(ValueError, match="no children"):
        credit_parents(parents, children[:9], "ar", "diffusion")  # gB/1 lost its children
    stray = children[0].model_copy(update={"group_id": "nobody"})
    with pytest.raises(ValueError, match="no parent's id"):
        children_by_parent(parents, [*children, stray])
    children[5].part("diffusion").reward = None
    with pytest.raises(ValueError, match="has no reward"):
        credit_parents(parents, children, "ar", "diffusion")
    with pytest.raises(ValueError, match="allowed"):
        credit_parents(parents, children, "ar", "diffusion", "median")  # type: ignore[arg-type]
