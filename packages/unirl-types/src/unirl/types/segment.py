"""Segments: what a generated Part's stage produced, in the form replay needs."""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Literal

from pydantic import Field, model_validator

from unirl.types.base import SchemaModel
from unirl.types.tensor import Tensor, dtype_name
from unirl.types.version import VersionSpan


class LatentTrajectory(SchemaModel):
    """A diffusion trajectory, stored at exactly the positions replay needs.

    Trajectory index ``i`` in ``0..T`` is the latent *before* denoising step ``i`` (``x_0`` is the
    initial noise, ``x_T`` the final latent). Replaying SDE step ``j`` needs ``x_j`` and ``x_{j+1}``,
    so every ``j`` in ``sde_indices`` has both ``j`` and ``j + 1`` in ``positions``.
    """

    kind: Literal["latent"] = "latent"
    latents: Tensor
    """``[len(positions), *latent_shape]``, in the dtype replay reads them in."""
    positions: list[int]
    """Trajectory indices (0..T) of the stored latents, strictly increasing."""
    sigmas: list[float]
    """The T+1 sigmas actually used (equal to the Part's pinned ``sampling_params.sigmas``)."""
    sde_indices: list[int]
    """Denoising steps that ran the SDE, strictly increasing, each < T."""
    log_probs: Tensor | None = None
    """``[len(sde_indices)]`` fp32: per-step log-prob (mean over latent elements); None when the
    algorithm needs none (DiffusionNFT)."""
    old_means: Tensor | None = None
    """``[len(sde_indices), *latent_shape]``: the rollout policy's Gaussian means (FlowDPPO)."""

    @property
    def num_steps(self) -> int:
        return len(self.sigmas) - 1

    def latent_at(self, position: int) -> Tensor:
        """The stored latent at trajectory index ``position``."""
        try:
            return self.latents[self.positions.index(position)]
        except ValueError:
            raise KeyError(
                f"trajectory position {position} is not stored; stored: {self.positions}"
            ) from None

    @model_validator(mode="after")
    def _consistent(self) -> LatentTrajectory:
        T = len(self.sigmas) - 1
        if T < 1:
            raise ValueError(f"sigmas must hold T+1 >= 2 values; got {len(self.sigmas)}")
        if len(self.latents.shape) < 2 or self.latents.shape[0] != len(self.positions):
            raise ValueError(
                f"latents has shape {list(self.latents.shape)}; expected [len(positions)={len(self.positions)}, ...]"
            )
        if any(b <= a for a, b in zip(self.positions, self.positions[1:])) or not all(
            0 <= p <= T for p in self.positions
        ):
            raise ValueError(f"positions must be strictly increasing in 0..{T}; got {self.positions}")
        if any(b <= a for a, b in zip(self.sde_indices, self.sde_indices[1:])) or not all(
            0 <= j < T for j in self.sde_indices
        ):
            raise ValueError(f"sde_indices must be strictly increasing in 0..{T - 1}; got {self.sde_indices}")
        stored = set(self.positions)
        missing = [j for j in self.sde_indices if j not in stored or j + 1 not in stored]
        if missing:
            raise ValueError(
                f"sde steps {missing} need latents at j and j+1; stored positions: {self.positions}"
            )
        n = len(self.sde_indices)
        if self.log_probs is not None and (
            list(self.log_probs.shape) != [n] or dtype_name(self.log_probs) != "float32"
        ):
            raise ValueError(
                f"log_probs must be float32 [{n}] (one per sde index); got "
                f"{dtype_name(self.log_probs)} {list(self.log_probs.shape)}"
            )
        if self.old_means is not None and list(self.old_means.shape) != [n, *self.latents.shape[1:]]:
            raise ValueError(
                f"old_means has shape {list(self.old_means.shape)}; expected {[n, *self.latents.shape[1:]]}"
            )
        return self


class TextSegment(SchemaModel):
    """Generated tokens with the log-probs of the distribution they were sampled from."""

    kind: Literal["text"] = "text"
    prompt_ids: list[int]
    response_ids: list[int]
    log_probs: Tensor | None = None
    """``[len(response_ids)]`` fp32 token log-probs from the sampler (None for SFT data)."""
    loss_mask: Tensor | None = None
    """``[len(response_ids)]`` bool; None means every response token is trained on."""
    finish_reason: Literal["stop", "length", "abort"] = "stop"
    versions: list[VersionSpan] | None = None
    """Which policy sampled which tokens (partial rollouts): spans with strictly increasing
    ``start`` (the first at 0, each holding at least one token) and strictly increasing
    ``version``; ``log_probs[t]`` is then the log-prob under the span holding ``t``. None: one
    policy sampled every token (the Part's ``weight_version``)."""

    def token_versions(self) -> list[int] | None:
        """The policy version that sampled each response token (None without ``versions``)."""
        if self.versions is None:
            return None
        ends = [s.start for s in self.versions[1:]] + [len(self.response_ids)]
        return [s.version for s, end in zip(self.versions, ends) for _ in range(end - s.start)]

    @property
    def oldest_version(self) -> int | None:
        """The oldest policy version among the tokens: a Sample's staleness is measured from it."""
        return None if not self.versions else self.versions[0].version

    @model_validator(mode="after")
    def _lengths(self) -> TextSegment:
        n = len(self.response_ids)
        if self.versions is not None:
            starts = [s.start for s in self.versions]
            versions = [s.version for s in self.versions]
            ok = not starts or (starts[0] == 0 and starts[-1] < n)
            if (
                not ok
                or any(b <= a for a, b in pairwise(starts))
                or any(b <= a for a, b in pairwise(versions))
            ):
                raise ValueError(
                    f"versions must start at token 0 with strictly increasing starts (< {n} response "
                    f"tokens) and strictly increasing versions; got starts {starts}, versions {versions}"
                )
        for name in ("log_probs", "loss_mask"):
            v = getattr(self, name)
            if v is not None and list(v.shape) != [n]:
                raise ValueError(f"{name} has shape {list(v.shape)}; expected [{n}] (one per response token)")
        if self.loss_mask is not None and dtype_name(self.loss_mask) != "bool":
            raise ValueError(f"loss_mask must be bool; got {dtype_name(self.loss_mask)}")
        return self


Segment = Annotated[LatentTrajectory | TextSegment, Field(discriminator="kind")]
