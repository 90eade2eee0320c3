"""Pure dispatch functions: dp split sizes, scatter to peers, gather from representatives."""

from __future__ import annotations

import pytest

from unirl.distributed.dispatch import gather_dp, scatter_dp, split_dp
from unirl.distributed.rank import MeshShape, all_rank_infos


def test_split_dp_contiguous_with_remainder_first() -> None:
    # 5 items over dp=2: divmod(5, 2) = (2, 1) -> sizes [3, 2]
    assert split_dp([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert split_dp([0, 1], 4) == [[0], [1], [], []]
    assert split_dp([], 3) == [[], [], []]


def test_scatter_gives_tp_peers_the_same_chunk_and_gather_restores_order() -> None:
    ranks = all_rank_infos(MeshShape(dp=2, tp=2))  # ranks 0,1 -> dp 0; 2,3 -> dp 1
    chunks = scatter_dp(list("abcde"), ranks)
    assert chunks == [list("abc"), list("abc"), list("de"), list("de")]
    # tp peers return different junk: only the representative (tp_rank 0) is kept
    outs = [[c.upper() for c in ch] if r.tp_rank == 0 else ["junk"] * len(ch) for ch, r in zip(chunks, ranks)]
    assert gather_dp(outs, ranks) == list("ABCDE")


def test_gather_rejects_non_list_outputs() -> None:
    ranks = all_rank_infos(MeshShape(dp=2))
    with pytest.raises(TypeError, match="must return a list"):
        gather_dp([[1], 2], ranks)  # type: ignore[list-item]  # the wrong type is the point


def test_split_rejects_strings() -> None:
    with pytest.raises(TypeError):
        split_dp("abc", 2)
