"""The shared half of the HTTP diffusion engines (``sglang``, ``vllm_omni``).

The driver pins everything that decides a trajectory and sends it: the T + 1 sigmas (pinned once
on the Part, ``FlowMatchPipeline.pin_sigmas`` semantics), the noise recipe (a per-sample seed
derived as ``unirl.rollout.noise.stable_seed(seed, noise_key)``, so siblings of a group share it
when ``noise.scope == "group"``), the SDE strategy, eta and the SDE indices of this rollout step.
A backend turns that into its request and parses its reply into a :class:`RemoteTrajectory`;
this base checks the reply at the boundary — the sigma echo (``guards.check_sigma_echo``), the
echoed SDE indices, one log-prob per SDE step, every latent replay needs — and fills the Part's
``LatentTrajectory`` exactly as the trainside pipeline would (positions j, j + 1 of every SDE
step plus the final latent).

Conditions (text embeddings) are not returned by remote engines; training re-encodes prompts
with the trainer's frozen encoders for replay.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from unirl.rollout.engines.guards import check_sigma_echo
from unirl.rollout.engines.http import EngineHTTPClient, EngineProtocolError, HTTPEngineConfig
from unirl.rollout.noise import noise_key, stable_seed
from unirl.rollout.schedules import static_shifted_sigmas
from unirl.types import DiffusionSamplingParams, ImagePrimitive, LatentTrajectory, Part, Sample

__all__ = [
    "RemoteDiffusionEngine",
    "RemoteDiffusionEngineConfig",
    "RemoteTrajectory",
    "RolloutRequest",
    "image_from_array",
]


@dataclass(frozen=True)
class RolloutRequest:
    """Everything pinned by the driver for one sample."""

    sample_id: str
    prompt: str
    params: DiffusionSamplingParams
    """With ``sigmas`` pinned (T + 1 values)."""
    sde_indices: list[int]
    seed: int
    """The per-sample seed of the initial noise: ``stable_seed(params.noise.seed, noise_key)``."""
    noise_key: str


@dataclass
class RemoteTrajectory:
    """A parsed engine reply for one sample."""

    latents: Tensor
    """``[len(positions), *latent_shape]``."""
    positions: list[int]
    sigmas: list[float]
    """The sigmas the engine reports it used: T + 1 values, or T (no terminal value)."""
    log_probs: Tensor | None
    """One per SDE step ``[len(sde_indices)]``, or one per denoising step ``[T]``."""
    sde_indices: list[int] | None = None
    """As echoed by the engine (None: not echoed)."""
    image: Any = None
    """uint8 ``[H, W, C]`` decoded output, if returned."""


def image_from_array(x: Any, where: str) -> np.ndarray:
    """uint8 ``[H, W, C]`` from uint8 HWC, or float CHW / HWC in [0, 1] (a leading batch of 1 dropped)."""
    arr = (
        x.detach().cpu().float().numpy()
        if isinstance(x, Tensor) and x.dtype != torch.uint8
        else np.asarray(x)
    )
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 3:
        raise EngineProtocolError(f"{where}: decoded image has shape {list(arr.shape)}; expected 3 dims")
    if arr.dtype == np.uint8:
        hwc = arr if arr.shape[-1] in (1, 3, 4) else arr.transpose(1, 2, 0)
        return np.ascontiguousarray(hwc)
    hwc = arr if arr.shape[-1] in (1, 3, 4) else arr.transpose(1, 2, 0)
    return np.ascontiguousarray((np.clip(hwc, 0.0, 1.0) * 255.0).round().astype(np.uint8))


def pin_static(params: DiffusionSamplingParams) -> DiffusionSamplingParams:
    """Pin a static shifted schedule; dynamic shift needs the model's bundle (pass ``pin=``)."""
    if params.sigmas is not None:
        return params
    if params.dynamic_shift:
        raise ValueError(
            "dynamic_shift needs the model's image-token count to pin sigmas; pass "
            "pin=lambda p: pin_sigmas(p, bundle) (unirl.rollout.pipelines.pin_sigmas) to the engine"
        )
    return params.model_copy(update={"sigmas": static_shifted_sigmas(params.num_steps, params.shift)})


class RemoteDiffusionEngine(abc.ABC):
    """Base of the HTTP diffusion engines; subclasses implement ``request_one``.

    Args:
        client: HTTP client of the server.
        stage: the Part it fills.
        prompt_part: take the prompt from this earlier Part's text (prompt enhancer).
        default_params: for Parts that carry no DiffusionSamplingParams.
        pin: fills ``sigmas`` of params that carry none (default: static shift; pass
            ``lambda p: pin_sigmas(p, bundle)`` for dynamic shift).
        sigma_atol / sigma_rtol: sigma echo tolerance.
        max_concurrency: requests in flight at once (one sample per request).
        weight_version: stamped on every Part (the policy version the server holds).
    """

    kind: str = "remote"

    def __init__(
        self,
        client: EngineHTTPClient,
        *,
        stage: str = "diffusion",
        prompt_part: str | None = None,
        default_params: DiffusionSamplingParams | None = None,
        pin: Callable[[DiffusionSamplingParams], DiffusionSamplingParams] = pin_static,
        sigma_atol: float = 1e-6,
        sigma_rtol: float = 1e-5,
        max_concurrency: int = 8,
        weight_version: int = 0,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency={max_concurrency} must be >= 1")
        self.client, self.stage, self.prompt_part = client, stage, prompt_part
        self.default_params, self.pin = default_params, pin
        self.sigma_atol, self.sigma_rtol = sigma_atol, sigma_rtol
        self.max_concurrency = max_concurrency
        self.weight_version = weight_version
        self.asleep = False
        self.last_metrics: dict[str, float] = {}

    @abc.abstractmethod
    def request_one(self, req: RolloutRequest) -> RemoteTrajectory:
        """Send one sample's request and parse the reply (protocol errors name the sample)."""

    def set_weight_version(self, version: int) -> None:
        """Record the version the server now serves (after the server's weights were updated)."""
        if version < self.weight_version:
            raise ValueError(f"weight version {version} is older than the engine's {self.weight_version}")
        self.weight_version = version

    def _request(self, s: Sample, part: Part, rollout_step: int) -> RolloutRequest:
        params = part.sampling_params if part.sampling_params is not None else self.default_params
        if not isinstance(params, DiffusionSamplingParams):
            raise TypeError(
                f"sample {s.id!r} part {self.stage!r}: sampling_params must be DiffusionSamplingParams "
                f"(set it on the Part or pass default_params=); got {type(params).__name__}"
            )
        params = self.pin(params)
        key = noise_key(s.id, s.group_id, params.noise.scope)
        prompt = s.part(self.prompt_part).text if self.prompt_part else s.prompt
        return RolloutRequest(
            sample_id=s.id,
            prompt=prompt,
            params=params,
            sde_indices=params.resolve_sde_indices(rollout_step),
            seed=stable_seed(params.noise.seed, key),
            noise_key=key,
        )

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        """Fill Part ``stage`` of every Sample from the server; returns the same Samples."""
        if self.asleep:
            raise RuntimeError(
                f"{self.kind} engine {self.client.url}: generate called while asleep; call wake_up()"
            )
        parts = [s.ensure_part(self.stage, parent=self.prompt_part) for s in samples]
        reqs = [self._request(s, p, rollout_step) for s, p in zip(samples, parts)]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, max(len(reqs), 1))) as pool:
            replies = list(pool.map(self.request_one, reqs))
        worst = 0.0
        for part, req, reply in zip(parts, reqs, replies):
            worst = max(worst, self._fill(part, req, reply))
        self.last_metrics = {"engine/sigma_echo_max_dev": worst}
        return samples

    def _fill(self, part: Part, req: RolloutRequest, r: RemoteTrajectory) -> float:
        where = f"{self.kind} engine {self.client.url} sample {req.sample_id!r}"
        pinned = list(req.params.sigmas or [])
        T = req.params.num_steps
        echo = pinned[: len(r.sigmas)] if len(r.sigmas) == T else pinned  # T values: no terminal echo
        dev = check_sigma_echo(req.sample_id, echo, r.sigmas, atol=self.sigma_atol, rtol=self.sigma_rtol)
        sde = req.sde_indices
        if r.sde_indices is not None and list(r.sde_indices) != sde:
            raise EngineProtocolError(
                f"{where}: engine ran the SDE on steps {r.sde_indices}, the driver pinned {sde}"
            )
        keep = sorted({p for j in sde for p in (j, j + 1)} | {T})
        missing = [p for p in keep if p not in r.positions]
        if missing:
            raise EngineProtocolError(
                f"{where}: reply lacks latents at trajectory positions {missing} (has {r.positions}); replay needs "
                "x_j and x_j+1 of every SDE step and the final latent"
            )
        lat = torch.stack([r.latents[r.positions.index(p)] for p in keep])
        lp = r.log_probs
        scored = req.params.sde_strategy != "ode" and req.params.eta > 0 and bool(sde)
        if lp is not None:
            lp = lp.detach().float().reshape(-1).cpu()
            if lp.numel() == T and len(sde) != T:
                lp = lp[sde]
            if lp.numel() != len(sde):
                raise EngineProtocolError(f"{where}: {lp.numel()} log-probs for {len(sde)} SDE steps {sde}")
            if not torch.isfinite(lp).all():
                raise EngineProtocolError(f"{where}: non-finite log-probs {lp.tolist()}")
        elif scored:
            raise EngineProtocolError(
                f"{where}: reply has no log-probs but {len(sde)} SDE steps were requested"
            )
        part.segment = LatentTrajectory(
            latents=lat, positions=keep, sigmas=pinned, sde_indices=sde, log_probs=lp if scored else None
        )
        part.sampling_params = req.params
        part.outputs = [ImagePrimitive(pixels=r.image)] if r.image is not None else []
        part.status = "completed"
        part.weight_version = self.weight_version
        return dev

    def sleep(self) -> None:
        """Mark asleep; subclasses with a memory route release the server's memory first."""
        self.asleep = True

    def wake_up(self) -> None:
        self.asleep = False

    def close(self) -> None:
        self.client.close()


class RemoteDiffusionEngineConfig(HTTPEngineConfig):
    """The fields every HTTP diffusion engine config shares (``sglang``, ``vllm_omni``)."""

    sampling: DiffusionSamplingParams | None = Field(default=None, description="for Parts that carry none")
    stage: str = Field(default="diffusion", min_length=1)
    prompt_part: str | None = Field(default=None, description="prompt from this earlier Part's text")
    sigma_atol: float = Field(default=1e-6, ge=0)
    sigma_rtol: float = Field(default=1e-5, ge=0)
    max_concurrency: int = Field(default=8, ge=1, description="requests in flight")

    def engine_kwargs(self, pin: Any = None) -> dict[str, Any]:
        """``RemoteDiffusionEngine`` keyword arguments from these fields (and ``pin`` when given)."""
        kw: dict[str, Any] = dict(
            stage=self.stage,
            prompt_part=self.prompt_part,
            default_params=self.sampling,
            sigma_atol=self.sigma_atol,
            sigma_rtol=self.sigma_rtol,
            max_concurrency=self.max_concurrency,
        )
        if pin is not None:
            kw["pin"] = pin
        return kw
