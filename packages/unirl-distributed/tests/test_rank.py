"""Rank layout: tp fastest, then sp, dp, pp slowest; ep folded into dp x sp."""

from __future__ import annotations

import pytest

from unirl.distributed.rank import MeshShape, all_rank_infos, rank_info


def test_world_size_is_product_of_pp_dp_sp_tp() -> None:
    assert MeshShape(dp=2, tp=2, pp=3, sp=1).world_size == 12
    assert MeshShape().world_size == 1


def test_worked_layout_dp2_tp2_pp2() -> None:
    # rank = ((pp*dp_size + dp)*sp_size + sp)*tp_size + tp with dp=2, tp=2, pp=2, sp=1:
    # rank 5 -> tp = 5 % 2 = 1; dp = (5 // 2) % 2 = 0; pp = 5 // 4 = 1
    info = rank_info(MeshShape(dp=2, tp=2, pp=2), 5)
    assert (info.tp_rank, info.dp_rank, info.pp_rank, info.sp_rank) == (1, 0, 1, 0)
    coords = [(i.pp_rank, i.dp_rank, i.tp_rank) for i in all_rank_infos(MeshShape(dp=2, tp=2, pp=2))]
    assert coords == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]


def test_sp_between_tp_and_dp() -> None:
    # dp=2, sp=2, tp=1: rank 3 -> sp = 3 % 2 = 1, dp = 3 // 2 = 1
    info = rank_info(MeshShape(dp=2, sp=2), 3)
    assert (info.sp_rank, info.dp_rank) == (1, 1)


def test_ep_folds_into_dp_times_sp() -> None:
    # dp=4, ep=2: ep_rank = dp % 2 -> [0, 1, 0, 1]
    assert [i.ep_rank for i in all_rank_infos(MeshShape(dp=4, ep=2))] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="ep=3 must divide dp\\*sp=4"):
        MeshShape(dp=4, ep=3)


def test_dp_representative_is_last_stage_tp0() -> None:
    reps = [i.rank for i in all_rank_infos(MeshShape(dp=2, tp=2, pp=2)) if i.is_dp_representative]
    assert reps == [4, 6]  # pp=1, tp=0, dp=0 and dp=1


def test_bad_mesh_values_are_named() -> None:
    with pytest.raises(ValueError, match="MeshShape.tp=0"):
        MeshShape(tp=0)
    with pytest.raises(TypeError, match="MeshShape.dp must be an int"):
        MeshShape(dp=2.0)  # type: ignore[arg-type]  # the wrong type is the point
    with pytest.raises(ValueError, match="rank=4 is outside"):
        rank_info(MeshShape(dp=2, tp=2), 4)
