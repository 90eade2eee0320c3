"""``SGLangDiffusionEngine`` (kind ``sglang``): SGLang-Diffusion's RL rollout route.

Wire format: ``POST /v1/rl/generate`` of SGLang's diffusion server (``sglang serve`` of a
diffusion model; the route lives in its post-training entrypoints and its availability depends on
the SGLang version) with one prompt per request and

    {prompts: [p], height, width, num_inference_steps, guidance_scale, seed, negative_prompt,
     sde_type: "sde" | "cps", noise_level: eta, sde_indices: [...], sigmas: [T + 1 pinned],
     return_trajectory_latents, return_trajectory_timesteps, return_trajectory_log_probs,
     return_decoded, response_format: "safetensors"}

The reply is a safetensors blob (parsed with ``safetensors``, never pickle):
``trajectory_latents`` ``[1, T + 1, ...]``, ``trajectory_timesteps`` (the sigmas used; ``[T]``
or ``[T + 1]``, ``timestep_type`` in the header metadata), ``trajectory_log_probs``
``[1, n]`` and ``decoded_output``. Servers that do not know the ``sigmas`` field ignore it and use
their own schedule: the sigma echo guard then fails the rollout, naming the sample and deviation.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Literal

from pydantic import Field
from torch import Tensor

from unirl.rollout.engines.http import (
    EngineHTTPClient,
    EngineHTTPError,
    EngineProtocolError,
)
from unirl.rollout.engines.remote_diffusion import (
    RemoteDiffusionEngine,
    RemoteDiffusionEngineConfig,
    RemoteTrajectory,
    RolloutRequest,
    image_from_array,
)

__all__ = ["SGLangDiffusionEngine", "SGLangDiffusionEngineConfig", "load_safetensors_blob"]

SDE_TYPES = {"flow_sde": "sde", "cps": "cps"}
"""Our SDE strategies SGLang-Diffusion's rollout implements (its ``sde_type`` names)."""


def load_safetensors_blob(blob: bytes, where: str) -> tuple[dict[str, Tensor], dict[str, str]]:
    """``(tensors, header metadata)`` of a safetensors byte string."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    if len(blob) < 8:
        raise EngineProtocolError(f"{where}: reply is {len(blob)} bytes, not a safetensors blob")
    (n,) = struct.unpack("<Q", blob[:8])
    try:
        header = json.loads(blob[8 : 8 + n])
        tensors = load(blob)
    except (ValueError, SafetensorError) as e:
        raise EngineProtocolError(f"{where}: reply is not valid safetensors ({e})") from None
    meta = (header.get("__metadata__") or {}) if isinstance(header, dict) else {}
    return tensors, {str(k): str(v) for k, v in meta.items()}


class SGLangDiffusionEngine(RemoteDiffusionEngine):
    """Diffusion rollouts from an SGLang-Diffusion server (see the module docstring)."""

    kind = "sglang"

    def __init__(
        self,
        client: EngineHTTPClient,
        *,
        sleep_path: str | None = None,
        wake_path: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(client, **kw)
        self.sleep_path, self.wake_path = sleep_path, wake_path

    def build_request(self, req: RolloutRequest) -> dict[str, Any]:
        p = req.params
        if p.sde_strategy not in SDE_TYPES and req.sde_indices:
            raise ValueError(
                f"sample {req.sample_id!r}: sde_strategy={p.sde_strategy!r} is not one SGLang-Diffusion "
                f"implements; use one of {sorted(SDE_TYPES)} or the trainside engine"
            )
        return {
            "prompts": [req.prompt],
            "height": p.height,
            "width": p.width,
            "num_inference_steps": p.num_steps,
            "guidance_scale": p.guidance_scale,
            "negative_prompt": p.negative_prompt,
            "seed": req.seed,
            "sde_type": SDE_TYPES.get(p.sde_strategy, "sde"),
            "noise_level": p.eta,
            "sde_indices": req.sde_indices,
            "sigmas": list(p.sigmas or []),
            "return_trajectory_latents": True,
            "return_trajectory_timesteps": True,
            "return_trajectory_log_probs": bool(req.sde_indices) and p.eta > 0,
            "return_decoded": True,
            "response_format": "safetensors",
        }

    def request_one(self, req: RolloutRequest) -> RemoteTrajectory:
        where = f"SGLang-Diffusion {self.client.url}/v1/rl/generate sample {req.sample_id!r}"
        resp = self.client.request("POST", "/v1/rl/generate", json=self.build_request(req))
        tensors, meta = load_safetensors_blob(resp.content, where)
        if "trajectory_latents" not in tensors or "trajectory_timesteps" not in tensors:
            raise EngineProtocolError(
                f"{where}: reply holds {sorted(tensors)}; needs trajectory_latents and trajectory_timesteps"
            )
        traj = tensors["trajectory_latents"]
        if traj.dim() < 3 or traj.shape[0] != 1:
            raise EngineProtocolError(
                f"{where}: trajectory_latents has shape {list(traj.shape)}; expected [1, T+1, ...]"
            )
        traj = traj[0]
        sig = tensors["trajectory_timesteps"].double().reshape(-1)
        if meta.get("timestep_type", "sigma") == "timestep":
            sig = sig / 1000.0
        lp = tensors.get("trajectory_log_probs")
        if lp is not None:
            lp = lp.reshape(-1)
        image = image_from_array(tensors["decoded_output"], where) if "decoded_output" in tensors else None
        return RemoteTrajectory(
            latents=traj,
            positions=list(range(int(traj.shape[0]))),
            sigmas=[float(x) for x in sig],
            log_probs=lp,
            sde_indices=json.loads(meta["sde_indices"]) if "sde_indices" in meta else None,
            image=image,
        )

    def _memory(self, path: str | None) -> None:
        if path is not None:
            resp = self.client.post_json(path, {}, idempotent=False)
            if isinstance(resp, dict) and resp.get("success") is False:
                raise EngineHTTPError(f"SGLang-Diffusion {self.client.url}{path} failed: {resp}")

    def sleep(self) -> None:
        """Release the server's memory through ``sleep_path`` (no route configured: nothing is freed)."""
        if not self.asleep:
            self._memory(self.sleep_path)
        super().sleep()

    def wake_up(self) -> None:
        if self.asleep:
            self._memory(self.wake_path)
        super().wake_up()


class SGLangDiffusionEngineConfig(RemoteDiffusionEngineConfig):
    """A dedicated SGLang-Diffusion engine (``rollout.engine.kind: sglang``)."""

    kind: Literal["sglang"] = "sglang"
    sleep_path: str | None = Field(
        default=None, description="route that releases memory; None: sleep frees nothing"
    )
    wake_path: str | None = None

    def build(self, *, pin: Any = None, transport: Any = None) -> SGLangDiffusionEngine:
        client = self.client(transport)
        return SGLangDiffusionEngine(
            client,
            sleep_path=self.sleep_path,
            wake_path=self.wake_path,
            **self.engine_kwargs(pin),
        )
