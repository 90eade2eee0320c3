"""Remote contract: every dispatch mode, sync and async, on LocalRemote and RayRemote."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from unirl.distributed import (
    DispatchMode,
    LocalRemote,
    MeshShape,
    RankInfo,
    RayRemote,
    RemoteBase,
    RemoteCallError,
)


class Echo:
    """A worker whose answers reveal which rank ran what."""

    def __init__(self, info: RankInfo) -> None:
        self.info = info
        self.calls = 0

    def whoami(self) -> tuple[int, int, int]:
        return (self.info.rank, self.info.dp_rank, self.info.tp_rank)

    def add(self, x: int, *, y: int = 0) -> int:
        return x + y + 100 * self.info.rank

    def double(self, items: list[int]) -> list[int]:
        # tp peers (tp_rank 1) answer differently: a gather that kept them would be caught
        return [2 * i + 1000 * self.info.tp_rank for i in items]

    def drop_one(self, items: list[int]) -> list[int]:
        return items[:-1]

    def fail_on_rank1(self, msg: str) -> int:
        if self.info.rank == 1:
            raise ValueError(msg)
        return self.info.rank

    def count(self) -> int:
        self.calls += 1
        return self.calls


MESH = MeshShape(dp=2, tp=2)


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.slow)], scope="module")
def remote(request: pytest.FixtureRequest) -> Iterator[RemoteBase[Echo]]:
    r: RemoteBase[Echo]
    if request.param == "local":
        r = LocalRemote(Echo, name="echo", mesh=MESH)
    else:
        request.getfixturevalue("ray_cluster")
        r = RayRemote.spawn(
            Echo, name="echo", mesh=MESH, cpus_per_worker=0.25, process_group=False, call_timeout_s=30
        )
    yield r
    r.shutdown()


class TestRemoteContract:
    def test_call_all_broadcasts_args_and_gathers_in_rank_order(self, remote: RemoteBase[Echo]) -> None:
        assert remote.call_all(Echo.add, 1, y=2) == [3, 103, 203, 303]
        assert remote.call_all(Echo.whoami) == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]

    def test_call_rank0_runs_on_rank0_only(self, remote: RemoteBase[Echo]) -> None:
        before = remote.call_all(Echo.count)
        assert remote.call_rank0(Echo.count) == before[0] + 1
        after = remote.call_all(Echo.count)
        assert [a - b for a, b in zip(after, before)] == [2, 1, 1, 1]

    def test_call_dp_scatters_by_dp_rank_and_concatenates(self, remote: RemoteBase[Echo]) -> None:
        # 5 items over dp=2 -> [0,1,2] to dp 0 (ranks 0,1) and [3,4] to dp 1 (ranks 2,3);
        # only tp_rank 0 outputs are kept, so no +1000
        assert remote.call_dp(Echo.double, [0, 1, 2, 3, 4]) == [0, 2, 4, 6, 8]
        assert remote.call_dp(Echo.double, []) == []

    def test_async_variants_return_futures(self, remote: RemoteBase[Echo]) -> None:
        f_all = remote.call_all_async(Echo.add, 1)
        f_dp = remote.call_dp_async(Echo.double, [1, 2])
        f_0 = remote.call_rank0_async(Echo.whoami)
        assert f_0.result(timeout=30) == (0, 0, 0)
        assert f_dp.result(timeout=30) == [2, 4]
        assert f_all.result(timeout=30) == [1, 101, 201, 301]
        assert f_all.done()

    def test_untyped_call_by_mode(self, remote: RemoteBase[Echo]) -> None:
        assert remote.call(DispatchMode.RANK0, Echo.add, 5) == 5
        assert remote.call(DispatchMode.DP, Echo.double, [3]) == [6]
        with pytest.raises(TypeError, match="exactly one positional list"):
            remote.call(DispatchMode.DP, Echo.double, [3], [4])

    def test_worker_error_names_remote_rank_and_method(self, remote: RemoteBase[Echo]) -> None:
        with pytest.raises(RemoteCallError, match=r"echo.*rank 1.*ValueError: boom"):
            remote.call_all(Echo.fail_on_rank1, "boom")
        assert remote.call_rank0(Echo.fail_on_rank1, "boom") == 0  # rank 0 alone is fine

    def test_dp_method_must_return_one_output_per_item(self, remote: RemoteBase[Echo]) -> None:
        with pytest.raises(ValueError, match="rank 0 got 2 items but returned 1"):
            remote.call_dp(Echo.drop_one, [1, 2, 3])

    def test_lambdas_are_refused(self, remote: RemoteBase[Echo]) -> None:
        with pytest.raises(TypeError, match="unbound worker method"):
            remote.call_all(lambda w: 1)


def test_local_remote_after_shutdown_refuses_calls() -> None:
    r = LocalRemote(Echo, name="echo")
    r.shutdown()
    with pytest.raises(RemoteCallError, match="shut down"):
        r.call_all(Echo.whoami)
    assert threading.active_count() >= 1


def test_remote_is_typed() -> None:
    """mypy checks these calls (the file is type-checked with the package in CI)."""
    r = LocalRemote(Echo, name="typed")
    outs: list[int] = r.call_all(Echo.add, 1, y=2)
    one: tuple[int, int, int] = r.call_rank0(Echo.whoami)
    dp: list[int] = r.call_dp(Echo.double, [1])
    assert (outs, one, dp) == ([3], (0, 0, 0), [2])
    _: Any = r
