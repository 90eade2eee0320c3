"""Mesh shape and per-worker rank information (dp/tp/pp/sp/ep), derived by pure arithmetic.

Rank layout (tp fastest, pp slowest, as in Megatron-LM): the global rank of the worker with
coordinates (pp, dp, sp, tp) is ``((pp * dp_size + dp) * sp_size + sp) * tp_size + tp``.
So tensor-parallel peers are adjacent ranks (same node, fastest links) and pipeline stages are
the coarsest split. Expert parallelism is folded into the data x sequence ranks (as Megatron
does): ``ep_size`` must divide ``dp_size * sp_size`` and ``ep_rank = (dp * sp_size + sp) % ep_size``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeshShape:
    """Sizes of the parallel axes of one Remote; ``world_size = pp * dp * sp * tp``."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    sp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for axis in ("dp", "tp", "pp", "sp", "ep"):
            value = getattr(self, axis)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"MeshShape.{axis} must be an int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"MeshShape.{axis}={value} must be >= 1")
        if (self.dp * self.sp) % self.ep != 0:
            raise ValueError(
                f"MeshShape.ep={self.ep} must divide dp*sp={self.dp * self.sp} (expert parallelism is "
                "folded into the data x sequence ranks); pick ep among the divisors of dp*sp"
            )

    @property
    def world_size(self) -> int:
        """Number of workers (processes) the mesh needs."""
        return self.pp * self.dp * self.sp * self.tp


@dataclass(frozen=True)
class RankInfo:
    """Where one worker sits: its global rank and its rank along every parallel axis."""

    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    sp_rank: int
    sp_size: int
    ep_rank: int
    ep_size: int

    @property
    def is_dp_representative(self) -> bool:
        """True for the one worker per dp rank whose outputs a dp gather keeps.

        That is the last pipeline stage (it holds the outputs) with tp_rank == sp_rank == 0.
        """
        return self.pp_rank == self.pp_size - 1 and self.tp_rank == 0 and self.sp_rank == 0


def rank_info(mesh: MeshShape, rank: int) -> RankInfo:
    """The RankInfo of global ``rank`` in ``mesh`` (see the module docstring for the layout)."""
    if not 0 <= rank < mesh.world_size:
        raise ValueError(f"rank={rank} is outside [0, world_size={mesh.world_size}) of {mesh}")
    tp = rank % mesh.tp
    sp = (rank // mesh.tp) % mesh.sp
    dp = (rank // (mesh.tp * mesh.sp)) % mesh.dp
    pp = rank // (mesh.tp * mesh.sp * mesh.dp)
    return RankInfo(
        rank=rank,
        world_size=mesh.world_size,
        dp_rank=dp,
        dp_size=mesh.dp,
        tp_rank=tp,
        tp_size=mesh.tp,
        pp_rank=pp,
        pp_size=mesh.pp,
        sp_rank=sp,
        sp_size=mesh.sp,
        ep_rank=(dp * mesh.sp + sp) % mesh.ep,
        ep_size=mesh.ep,
    )


def all_rank_infos(mesh: MeshShape) -> list[RankInfo]:
    """RankInfo of every worker of ``mesh``, in global-rank order."""
    return [rank_info(mesh, r) for r in range(mesh.world_size)]
