"""Device slabs on Ray placement groups; `colocate` vs `separate` placement of sibling Remotes.

A :class:`Slab` is one placement group of ``num_devices`` bundles, one bundle per device: a GPU
bundle is ``{"GPU": 1, "CPU": cpus_per_device}``, a CPU "device" bundle is
``{"CPU": cpus_per_device}`` (so the whole layer runs on a laptop with fractional CPU devices).
Worker ``r`` of a Remote on a slab sits on bundle ``r`` and takes ``share`` of it:

- ``colocate``: every role shares one slab (size = the largest world size); each role takes
  ``1 / len(roles)`` of every bundle, so e.g. trainer rank 0 and rollout rank 0 share device 0.
- ``separate``: each role gets its own slab of ``world_size`` devices and the whole of each bundle.

Capacity is checked against the cluster's free resources *before* any placement group or worker
is created, so too few devices is a clear error, not a hang.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from unirl.distributed.errors import InsufficientDevicesError

DeviceKind = Literal["cpu", "gpu"]
PlacementMode = Literal["colocate", "separate"]
# Ray accounts resources in units of 1e-4; shares are rounded down to it so they sum to <= 1.
_RESOLUTION = 10_000


@dataclass(frozen=True)
class SlabRequest:
    """One slab of a plan: its name, size, and which roles share it at which fraction."""

    name: str
    num_devices: int
    roles: tuple[str, ...]
    share: float


@dataclass(frozen=True)
class PlacementPlan:
    """Pure description of the slabs a placement needs (no Ray involved)."""

    mode: PlacementMode
    slabs: tuple[SlabRequest, ...]

    def slab_of(self, role: str) -> SlabRequest:
        """The slab ``role`` lives on."""
        for s in self.slabs:
            if role in s.roles:
                return s
        raise KeyError(
            f"role {role!r} is not in this plan (roles: {[r for s in self.slabs for r in s.roles]})"
        )

    def total_devices(self) -> int:
        """Devices the plan occupies in all."""
        return sum(s.num_devices for s in self.slabs)


def plan_placement(roles: dict[str, int], mode: PlacementMode) -> PlacementPlan:
    """Plan slabs for ``roles`` (role name -> world size) in ``mode``."""
    if not roles:
        raise ValueError("plan_placement needs at least one role")
    for role, size in roles.items():
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"placement role {role!r}: world size must be an int >= 1, got {size!r}")
    if mode == "colocate":
        share = math.floor(_RESOLUTION / len(roles)) / _RESOLUTION
        slab = SlabRequest("colocated", max(roles.values()), tuple(roles), share)
        return PlacementPlan(mode, (slab,))
    if mode == "separate":
        return PlacementPlan(mode, tuple(SlabRequest(r, n, (r,), 1.0) for r, n in roles.items()))
    raise ValueError(f"placement mode={mode!r} is not one of 'colocate', 'separate'")


def bundle_resources(device: DeviceKind, cpus_per_device: float) -> dict[str, float]:
    """Resources of one device bundle."""
    if device == "gpu":
        return {"GPU": 1.0, "CPU": cpus_per_device}
    if device == "cpu":
        return {"CPU": cpus_per_device}
    raise ValueError(f"device={device!r} is not one of 'cpu', 'gpu'")


def check_capacity(need: dict[str, float], available: dict[str, float], what: str) -> None:
    """Raise InsufficientDevicesError when ``need`` exceeds ``available`` for any resource."""
    short = {k: (v, available.get(k, 0.0)) for k, v in need.items() if v > available.get(k, 0.0) + 1e-9}
    if short:
        detail = ", ".join(f"{k}: need {n:g}, free {a:g}" for k, (n, a) in short.items())
        raise InsufficientDevicesError(
            f"{what} needs more than the Ray cluster has free ({detail}); lower the world sizes, use "
            "placement mode 'colocate', reduce cpus_per_device, or start Ray with more resources"
        )


@dataclass
class Slab:
    """A device slab backed by a Ray placement group (one bundle per device)."""

    name: str
    device: DeviceKind
    num_devices: int
    cpus_per_device: float
    placement_group: Any  # ray.util.placement_group.PlacementGroup (ray ships no type stubs)
    used: list[float] = field(default_factory=list)

    def claim(self, world_size: int, share: float, who: str) -> list[int]:
        """Reserve ``share`` of bundles 0..world_size-1 for ``who``; returns the bundle indices."""
        if world_size > self.num_devices:
            raise InsufficientDevicesError(
                f"{who}: world size {world_size} does not fit slab {self.name!r} of {self.num_devices} "
                "devices; allocate a larger slab"
            )
        if not 0 < share <= 1:
            raise ValueError(f"{who}: share={share} must be in (0, 1]")
        for i in range(world_size):
            if self.used[i] + share > 1 + 1e-9:
                raise InsufficientDevicesError(
                    f"{who}: device {i} of slab {self.name!r} is {self.used[i]:.4g} used; "
                    f"share {share:g} does not fit (colocated shares must sum to <= 1)"
                )
        for i in range(world_size):
            self.used[i] += share
        return list(range(world_size))

    def actor_options(self, bundle: int, share: float) -> dict[str, Any]:
        """Ray actor options that pin an actor to ``bundle`` with ``share`` of its resources."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        opts: dict[str, Any] = {
            "num_cpus": self.cpus_per_device * share,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=bundle
            ),
        }
        if self.device == "gpu":
            opts["num_gpus"] = share
        return opts

    def release(self) -> None:
        """Remove the placement group (its actors must be gone first)."""
        from ray.util import remove_placement_group

        remove_placement_group(self.placement_group)


def allocate_slabs(
    plan: PlacementPlan,
    *,
    device: DeviceKind = "cpu",
    cpus_per_device: float = 1.0,
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK",
    timeout_s: float = 60.0,
) -> dict[str, Slab]:
    """Create one placement group per slab of ``plan``; returns role -> Slab.

    Raises InsufficientDevicesError before creating anything when the free resources cannot hold
    the plan, and (after removing what it made) when a group is not ready within ``timeout_s``.
    """
    import ray
    from ray.util import placement_group, remove_placement_group

    per = bundle_resources(device, cpus_per_device)
    need = {k: v * plan.total_devices() for k, v in per.items()}
    free = ray.available_resources()  # type: ignore[no-untyped-call]  # ray: unannotated
    check_capacity(need, {k: float(v) for k, v in free.items()}, f"placement {plan}")
    made: list[Slab] = []
    for req in plan.slabs:
        pg = placement_group([dict(per) for _ in range(req.num_devices)], strategy=strategy)
        made.append(Slab(req.name, device, req.num_devices, cpus_per_device, pg, [0.0] * req.num_devices))
    ready, _ = ray.wait([s.placement_group.ready() for s in made], num_returns=len(made), timeout=timeout_s)
    if len(ready) != len(made):
        for s in made:
            remove_placement_group(s.placement_group)
        raise InsufficientDevicesError(
            f"placement groups for {[s.name for s in made]} were not ready within {timeout_s}s; the cluster "
            "may be fragmented (try strategy='SPREAD') or resources are held by other jobs"
        )
    by_name = {s.name: s for s in made}
    return {role: by_name[req.name] for req in plan.slabs for role in req.roles}


def place(
    roles: dict[str, int],
    mode: PlacementMode,
    *,
    device: DeviceKind = "cpu",
    cpus_per_device: float = 1.0,
    timeout_s: float = 60.0,
) -> tuple[PlacementPlan, dict[str, Slab]]:
    """Plan and allocate in one call: returns the plan and role -> Slab."""
    plan = plan_placement(roles, mode)
    return plan, allocate_slabs(plan, device=device, cpus_per_device=cpus_per_device, timeout_s=timeout_s)
