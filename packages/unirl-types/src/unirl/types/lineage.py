"""Multi-stage lineage (the prompt enhancer): parent Samples, their children, and reward crediting.

A parent Sample carries one generated Part (e.g. the ``ar`` rewrite of a prompt); each of its
``M`` children (``expand_children``) carries a copy of that Part's outputs followed by its own
Part conditioned on it (e.g. a ``diffusion`` render of the rewrite). The child's ``group_id`` is
the parent's ``id``, so

- the children's advantages, grouped by ``group_id``, are grouped by their parent (the image
  advantage of the PE trainer: images of one rewrite compete with each other);
- the parents' advantages, grouped by their own ``group_id``, are grouped by prompt;
- ``credit_parents`` gives each parent Part the mean (or max / min) of its children's rewards.

Worked example (``reduce="mean"``): a parent with children rewarded 1.0, 0.0, 0.5 is credited
0.5; with ``max`` 1.0, with ``min`` 0.0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from unirl.types.reward import Reward
from unirl.types.sample import Part, Sample

CreditReduce = Literal["mean", "max", "min"]
_REDUCE: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": lambda v: float(np.mean(v)),
    "max": lambda v: float(np.max(v)),
    "min": lambda v: float(np.min(v)),
}

__all__ = ["CreditReduce", "children_by_parent", "credit_parents", "expand_children"]


def expand_children(parents: Sequence[Sample], num_children: int, part_name: str) -> list[Sample]:
    """``num_children`` child Samples of each parent, each holding a copy of the parent's Part
    ``part_name`` (name, outputs, status, weight version: what conditions the next stage; not the
    segment, which only the parent trains on).

    Child ``j`` of parent ``p`` has id ``"<p.id>/c<j>"`` and group id ``p.id``; it keeps the
    parent's inputs and metadata (the original prompt and what the checker reads)."""
    if num_children < 1:
        raise ValueError(f"num_children={num_children}: each parent needs at least one child")
    out: list[Sample] = []
    for p in parents:
        src = p.part(part_name)
        if src.status == "pending":
            raise ValueError(f"sample {p.id!r}: part {part_name!r} is still pending; generate it first")
        for j in range(num_children):
            copy = Part(
                name=src.name,
                parent=src.parent,
                outputs=list(src.outputs),
                status=src.status,
                weight_version=src.weight_version,
            )
            out.append(
                Sample(
                    id=f"{p.id}/c{j}",
                    group_id=p.id,
                    inputs=list(p.inputs),
                    parts=[copy],
                    metadata=p.metadata.model_copy(deep=True),
                )
            )
    return out


def children_by_parent(parents: Sequence[Sample], children: Sequence[Sample]) -> dict[str, list[Sample]]:
    """parent id -> its children (``child.group_id == parent.id``), in order; every parent must have
    at least one child and every child a parent among ``parents``."""
    by_id: dict[str, list[Sample]] = {p.id: [] for p in parents}
    if len(by_id) != len(parents):
        raise ValueError("parent sample ids must be unique")
    for c in children:
        if c.group_id not in by_id:
            raise ValueError(
                f"child sample {c.id!r} has group_id {c.group_id!r}, which is no parent's id; "
                "children come from expand_children (group_id = the parent's id)"
            )
        by_id[c.group_id].append(c)
    orphans = [pid for pid, cs in by_id.items() if not cs]
    if orphans:
        raise ValueError(f"parent sample(s) {orphans[:3]} have no children to credit them")
    return by_id


def credit_parents(
    parents: Sequence[Sample],
    children: Sequence[Sample],
    parent_part: str,
    child_part: str,
    reduce: CreditReduce = "mean",
) -> np.ndarray:
    """Set each parent's Part ``parent_part`` reward to ``reduce`` of its children's ``child_part``
    reward totals; returns the credited totals ``[len(parents)]`` (float64).

    The credited Reward's components are the same reduction of each component the children share
    (e.g. ``geneval/count``), plus ``children_mean`` / ``children_max`` / ``children_min``.
    """
    if reduce not in _REDUCE:
        raise ValueError(f"reduce={reduce!r}: allowed {sorted(_REDUCE)}")
    fn = _REDUCE[reduce]
    groups = children_by_parent(parents, children)
    out = np.zeros(len(parents), dtype=np.float64)
    for i, p in enumerate(parents):
        rewards: list[Reward] = []
        for c in groups[p.id]:
            r = c.part(child_part).reward
            if r is None:
                raise ValueError(f"child sample {c.id!r} part {child_part!r} has no reward; score it first")
            rewards.append(r)
        totals = np.asarray([r.total for r in rewards], dtype=np.float64)
        shared = set.intersection(*(set(r.components) for r in rewards))
        comps = {k: float(fn([r.components[k] for r in rewards])) for k in sorted(shared)}
        comps |= {
            "children_mean": float(totals.mean()),
            "children_max": float(totals.max()),
            "children_min": float(totals.min()),
        }
        out[i] = fn(totals.tolist())
        p.part(parent_part).reward = Reward(total=out[i], components=comps)
    return out
