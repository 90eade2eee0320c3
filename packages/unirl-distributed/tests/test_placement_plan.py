"""Pure placement planning and capacity checks (no Ray)."""

from __future__ import annotations

import pytest

from unirl.distributed.errors import InsufficientDevicesError
from unirl.distributed.placement import bundle_resources, check_capacity, plan_placement


def test_colocate_shares_one_slab_of_the_largest_world() -> None:
    plan = plan_placement({"train": 2, "rollout": 4}, "colocate")
    assert len(plan.slabs) == 1
    slab = plan.slabs[0]
    assert (slab.num_devices, slab.roles, slab.share) == (4, ("train", "rollout"), 0.5)
    assert plan.total_devices() == 4


def test_colocate_three_roles_rounds_share_down_to_ray_resolution() -> None:
    # 1/3 rounded down to 1e-4 so three shares sum to 0.9999 <= 1
    assert plan_placement({"a": 1, "b": 1, "c": 1}, "colocate").slabs[0].share == 0.3333


def test_separate_gives_disjoint_slabs() -> None:
    plan = plan_placement({"train": 2, "rollout": 3}, "separate")
    assert [(s.name, s.num_devices, s.share) for s in plan.slabs] == [("train", 2, 1.0), ("rollout", 3, 1.0)]
    assert plan.total_devices() == 5
    assert plan.slab_of("rollout").num_devices == 3


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="'mixed' is not one of"):
        plan_placement({"a": 1}, "mixed")  # type: ignore[arg-type]  # the wrong value is the point
    with pytest.raises(ValueError, match="role 'a'"):
        plan_placement({"a": 0}, "separate")


def test_capacity_check_names_the_shortfall() -> None:
    need = {k: v * 6 for k, v in bundle_resources("gpu", 2.0).items()}  # 6 GPUs, 12 CPUs
    with pytest.raises(InsufficientDevicesError, match="GPU: need 6, free 4"):
        check_capacity(need, {"GPU": 4.0, "CPU": 64.0}, "placement")
    check_capacity(need, {"GPU": 8.0, "CPU": 12.0}, "placement")
