"""``VLLMOmniEngine`` (kind ``vllm_omni``): diffusion rollouts from a vLLM-Omni server.

Wire format: vLLM-Omni's documented image API, ``POST /v1/images/generations`` (OpenAI DALL-E
compatible: ``prompt``, ``n``, ``size`` "WxH", ``response_format`` "b64_json", plus its diffusion
fields ``num_inference_steps``, ``guidance_scale``, ``seed``, ``negative_prompt``), with the RL
rollout request in ``extra_args.rl_rollout``:

    {enabled: true, compute_log_prob, return_trajectory_latents: true,
     return_trajectory_log_probs, sigmas: [T + 1], sde_type, noise_level, sde_indices,
     noise: {seed, key}}

Trajectories are an RL extension: stock vLLM-Omni answers ``data[i].b64_json`` only, and this
engine then raises, saying the server lacks it. With the extension, ``data[0].rl_rollout``
carries ``sigmas`` (the schedule used), ``sde_indices`` and either inline tensors
(``latents`` ``[T + 1, ...]`` and ``log_probs`` as ``unirl.types`` encoded tensors: dtype,
shape, base64 little-endian bytes) or ``artifact_uri`` ``file://...safetensors`` on a shared
filesystem holding the same names. Nothing is unpickled.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import numpy as np
from pydantic import Field

from unirl.rollout.engines.http import (
    EngineHTTPClient,
    EngineProtocolError,
    require,
)
from unirl.rollout.engines.remote_diffusion import (
    RemoteDiffusionEngine,
    RemoteDiffusionEngineConfig,
    RemoteTrajectory,
    RolloutRequest,
)
from unirl.types import decode_tensor, to_torch

__all__ = ["VLLMOmniEngine", "VLLMOmniEngineConfig"]

SDE_TYPES = {"flow_sde": "sde", "dance_sde": "dance", "cps": "cps"}


def decode_png(b64: str, where: str) -> np.ndarray:
    """uint8 ``[H, W, C]`` of a base64 PNG/JPEG."""
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(base64.b64decode(b64, validate=True)))
        img.load()
    except Exception as e:
        raise EngineProtocolError(f"{where}: b64_json is not a decodable image ({e})") from None
    arr = np.asarray(img.convert("RGBA" if img.mode in ("RGBA", "LA") else "RGB"))
    return np.ascontiguousarray(arr)


class VLLMOmniEngine(RemoteDiffusionEngine):
    """Diffusion rollouts from vLLM-Omni (see the module docstring).

    ``sleep`` / ``wake_up`` use vLLM's sleep-mode routes (``/sleep?level=N``, ``/wake_up``) when
    ``sleep_level`` is set (the server must run with sleep mode enabled); with None nothing is freed.
    """

    kind = "vllm_omni"

    def __init__(
        self, client: EngineHTTPClient, *, model: str | None = None, sleep_level: int | None = None, **kw: Any
    ) -> None:
        super().__init__(client, **kw)
        self.model, self.sleep_level = model, sleep_level

    def build_request(self, req: RolloutRequest) -> dict[str, Any]:
        p = req.params
        if p.sde_strategy not in SDE_TYPES and req.sde_indices:
            raise ValueError(
                f"sample {req.sample_id!r}: sde_strategy={p.sde_strategy!r} has no vLLM-Omni equivalent; "
                f"use one of {sorted(SDE_TYPES)}"
            )
        scored = bool(req.sde_indices) and p.eta > 0
        body: dict[str, Any] = {
            "prompt": req.prompt,
            "n": 1,
            "size": f"{p.width}x{p.height}",
            "response_format": "b64_json",
            "num_inference_steps": p.num_steps,
            "guidance_scale": p.guidance_scale,
            "negative_prompt": p.negative_prompt,
            "seed": req.seed,
            "extra_args": {
                "rl_rollout": {
                    "enabled": True,
                    "compute_log_prob": scored,
                    "return_trajectory_latents": True,
                    "return_trajectory_log_probs": scored,
                    "sigmas": list(p.sigmas or []),
                    "sde_type": SDE_TYPES.get(p.sde_strategy, "sde"),
                    "noise_level": p.eta,
                    "sde_indices": req.sde_indices,
                    "noise": {"seed": req.seed, "key": req.noise_key},
                }
            },
        }
        if self.model is not None:
            body["model"] = self.model
        return body

    def _tensors(self, rl: dict[str, Any], where: str) -> dict[str, Any]:
        uri = rl.get("artifact_uri")
        if uri is not None:
            from safetensors.torch import load_file

            parsed = urlparse(str(uri))
            if parsed.scheme != "file" or not Path(parsed.path).is_file():
                raise EngineProtocolError(f"{where}: artifact_uri {uri!r} is not a readable file:// path")
            return dict(load_file(parsed.path))
        out = {}
        for name in ("latents", "log_probs"):
            if rl.get(name) is not None:
                try:
                    out[name] = to_torch(decode_tensor(rl[name]))
                except (ValueError, TypeError) as e:
                    raise EngineProtocolError(
                        f"{where}: rl_rollout.{name} is not an encoded tensor ({e})"
                    ) from None
        return out

    def request_one(self, req: RolloutRequest) -> RemoteTrajectory:
        where = f"vLLM-Omni {self.client.url}/v1/images/generations sample {req.sample_id!r}"
        reply = self.client.post_json("/v1/images/generations", self.build_request(req))
        data = require(reply, "data", list, where)
        if len(data) != 1:
            raise EngineProtocolError(f"{where}: {len(data)} images for n=1")
        item = data[0]
        rl = item.get("rl_rollout") if isinstance(item, dict) else None
        if not isinstance(rl, dict):
            raise EngineProtocolError(
                f"{where}: the reply has no rl_rollout trajectory; this vLLM-Omni server does not implement the "
                "RL rollout extension (stock servers return images only), so it cannot serve RL rollouts"
            )
        tensors = self._tensors(rl, where)
        if "latents" not in tensors:
            raise EngineProtocolError(f"{where}: rl_rollout carries no latents")
        lat = tensors["latents"]
        sigmas = require(rl, "sigmas", list, f"{where}.rl_rollout")
        positions = rl.get("positions", list(range(int(lat.shape[0]))))
        image = decode_png(item["b64_json"], where) if isinstance(item.get("b64_json"), str) else None
        sde = rl.get("sde_indices")
        return RemoteTrajectory(
            latents=lat,
            positions=[int(p) for p in positions],
            sigmas=[float(x) for x in sigmas],
            log_probs=tensors.get("log_probs"),
            sde_indices=[int(j) for j in sde] if isinstance(sde, list) else None,
            image=image,
        )

    def sleep(self) -> None:
        if not self.asleep and self.sleep_level is not None:
            self.client.request("POST", f"/sleep?level={self.sleep_level}", idempotent=False)
        super().sleep()

    def wake_up(self) -> None:
        if self.asleep and self.sleep_level is not None:
            self.client.request("POST", "/wake_up", idempotent=False)
        super().wake_up()


class VLLMOmniEngineConfig(RemoteDiffusionEngineConfig):
    """A dedicated vLLM-Omni diffusion engine (``rollout.engine.kind: vllm_omni``)."""

    kind: Literal["vllm_omni"] = "vllm_omni"
    model: str | None = Field(default=None, description="served model name (the request's `model`)")
    sleep_level: int | None = Field(default=None, ge=1, le=2, description="vLLM sleep level; None: no sleep")

    def build(self, *, pin: Any = None, transport: Any = None) -> VLLMOmniEngine:
        client = self.client(transport)
        return VLLMOmniEngine(
            client,
            model=self.model,
            sleep_level=self.sleep_level,
            **self.engine_kwargs(pin),
        )
