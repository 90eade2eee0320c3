"""HTTP diffusion engines (sglang, vllm_omni): protocol contract tests against local wire-format servers.

The servers reply with trajectories computed by the trainside ``FlowMatchPipeline`` on a tiny SD3
bundle, packed the way each engine's route answers (SGLang-Diffusion: a safetensors blob;
vLLM-Omni: JSON with encoded tensors). They check the request fields; they do not stand in for
the real engines' numerics (``gpu`` live tests: ``UNIRL_SGLANG_DIFFUSION_URL``, ``UNIRL_VLLM_OMNI_URL``).
"""

from __future__ import annotations

import base64
import io
import json
import os
from typing import Any

import numpy as np
import pytest
import torch

from unirl.rollout.engines import (
    RolloutEngine,
    SGLangDiffusionEngineConfig,
    SigmaEchoError,
    VLLMOmniEngineConfig,
)
from unirl.rollout.engines.http import EngineProtocolError
from unirl.rollout.engines.testing import WireServer
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.rollout.schedules import static_shifted_sigmas
from unirl.types import DiffusionSamplingParams, Sample, TextPrimitive, encode_tensor


def params(**kw: Any) -> DiffusionSamplingParams:
    return DiffusionSamplingParams(**{"num_steps": 4, "guidance_scale": 1.0, "height": 16, "width": 16, **kw})


def samples(n: int = 2) -> list[Sample]:
    return [Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text="a red circle")]) for i in range(n)]


def reference_rollout(
    bundle: Any, body_prompt: str, p: DiffusionSamplingParams, sde: list[int], step: int = 0
) -> Any:
    """What a faithful engine computes: the trainside pipeline on the requested prompt and schedule."""
    assert p.resolve_sde_indices(step) == sde, (p.resolve_sde_indices(step), sde)
    s = Sample(id="ref", group_id="g", inputs=[TextPrimitive(text=body_prompt)])
    s.ensure_part("diffusion").sampling_params = p
    return FlowMatchPipeline(bundle, default_params=p).generate([s], rollout_step=step)[0].part("diffusion")


def sglang_route(bundle: Any, *, shift_override: float | None = None) -> Any:
    from safetensors.torch import save

    def route(body: dict[str, Any]) -> tuple[int, Any]:
        assert len(body["prompts"]) == 1 and body["response_format"] == "safetensors"
        sig = (
            body["sigmas"]
            if shift_override is None
            else static_shifted_sigmas(body["num_inference_steps"], shift_override)
        )
        p = params(num_steps=body["num_inference_steps"], eta=body["noise_level"], sigmas=sig)
        part = reference_rollout(bundle, body["prompts"][0], p, body["sde_indices"])
        seg = part.segment
        dense = torch.zeros(seg.num_steps + 1, *seg.latents.shape[1:])
        for i, pos in enumerate(seg.positions):
            dense[pos] = seg.latents[i]
        tensors = {
            "trajectory_latents": dense[None],
            "trajectory_timesteps": torch.tensor(sig[:-1], dtype=torch.float32),  # T values, no terminal
            "trajectory_log_probs": seg.log_probs[None],
            "decoded_output": torch.as_tensor(part.outputs[0].pixels)[None],
        }
        return 200, save(
            tensors, metadata={"timestep_type": "sigma", "sde_indices": json.dumps(body["sde_indices"])}
        )

    return route


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    s = WireServer({})
    yield s
    s.close()


def test_sglang_diffusion_sends_pinned_schedule_and_parses_safetensors(server, sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    server.routes["/v1/rl/generate"] = sglang_route(sd3_bundle)
    eng = SGLangDiffusionEngineConfig(url=server.url, sampling=params()).build()
    assert isinstance(eng, RolloutEngine)
    out = eng.generate(samples(2), rollout_step=0)
    body = server.calls[0][1]
    pinned = static_shifted_sigmas(4, 3.0)
    assert body["sigmas"] == pinned and body["sde_type"] == "sde" and body["noise_level"] == 0.7
    assert body["sde_indices"] == [0, 1, 2, 3] and body["num_inference_steps"] == 4
    assert body["seed"] != server.calls[1][1]["seed"]  # per-sample noise (scope "sample")
    part = out[0].part("diffusion")
    seg = part.segment
    assert seg.sigmas == pinned and seg.positions == [0, 1, 2, 3, 4] and seg.log_probs.shape == (4,)
    assert part.outputs[0].pixels.dtype == np.uint8 and part.status == "completed"
    ref = reference_rollout(sd3_bundle, "a red circle", params(sigmas=pinned), [0, 1, 2, 3]).segment
    assert torch.allclose(seg.log_probs, ref.log_probs) and torch.allclose(seg.latents, ref.latents)
    assert eng.last_metrics["engine/sigma_echo_max_dev"] < 1e-6


def test_sglang_diffusion_group_noise_and_sigma_mismatch(server, sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    server.routes["/v1/rl/generate"] = sglang_route(sd3_bundle, shift_override=1.0)  # ignores our sigmas
    eng = SGLangDiffusionEngineConfig(url=server.url, sampling=params(noise={"scope": "group"})).build()
    with pytest.raises(SigmaEchoError, match=r"sample 's\d'.*max deviation"):
        eng.generate(samples(2), rollout_step=0)
    assert server.calls[0][1]["seed"] == server.calls[1][1]["seed"]  # siblings share x_T


def test_sglang_diffusion_malformed_replies(server, sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    eng = SGLangDiffusionEngineConfig(url=server.url, sampling=params()).build()
    server.routes["/v1/rl/generate"] = lambda b: (200, b"\x00garbage")
    with pytest.raises(EngineProtocolError, match="not a safetensors blob|not valid safetensors"):
        eng.generate(samples(1), rollout_step=0)
    dance = SGLangDiffusionEngineConfig(url=server.url, sampling=params(sde_strategy="dance_sde")).build()
    with pytest.raises(ValueError, match="dance_sde.*not one SGLang-Diffusion implements"):
        dance.generate(samples(1), rollout_step=0)


def vllm_route(bundle: Any, *, trajectory: bool = True, schedule: Any = None, step: int = 0) -> Any:
    from PIL import Image

    def route(body: dict[str, Any]) -> tuple[int, Any]:
        assert body["n"] == 1 and body["size"] == "16x16" and body["response_format"] == "b64_json"
        rl = body["extra_args"]["rl_rollout"]
        extra = {"sde_schedule": schedule} if schedule is not None else {}
        p = params(num_steps=body["num_inference_steps"], eta=rl["noise_level"], sigmas=rl["sigmas"], **extra)
        part = reference_rollout(bundle, body["prompt"], p, rl["sde_indices"], step)
        buf = io.BytesIO()
        Image.fromarray(np.asarray(part.outputs[0].pixels)).save(buf, format="PNG")
        item: dict[str, Any] = {"b64_json": base64.b64encode(buf.getvalue()).decode()}
        if trajectory:
            seg = part.segment
            item["rl_rollout"] = {
                "sigmas": rl["sigmas"],
                "sde_indices": rl["sde_indices"],
                "positions": seg.positions,
                "latents": encode_tensor(seg.latents),
                "log_probs": encode_tensor(seg.log_probs),
            }
        return 200, {"created": 0, "data": [item]}

    return route


def test_vllm_omni_documented_request_plus_rl_extension(server, sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    schedule = {"kind": "k_of_window", "k": 2, "end": 0.75}
    server.routes["/v1/images/generations"] = vllm_route(sd3_bundle, schedule=schedule, step=3)
    p = params(sde_schedule=schedule)
    eng = VLLMOmniEngineConfig(url=server.url, model="tiny", sampling=p).build()
    out = eng.generate(samples(2), rollout_step=3)
    body = server.calls[0][1]
    sde = p.resolve_sde_indices(3)
    assert body["model"] == "tiny" and body["extra_args"]["rl_rollout"]["sde_indices"] == sde
    seg = out[1].part("diffusion").segment
    assert seg.sde_indices == sde and seg.log_probs.shape == (2,)
    assert seg.positions == sorted({q for j in sde for q in (j, j + 1)} | {4})
    assert out[1].part("diffusion").outputs[0].pixels.shape == (16, 16, 3)


def test_vllm_omni_without_the_extension_says_so(server, sd3_bundle) -> None:  # type: ignore[no-untyped-def]
    server.routes["/v1/images/generations"] = vllm_route(sd3_bundle, trajectory=False)
    eng = VLLMOmniEngineConfig(url=server.url, sampling=params()).build()
    with pytest.raises(EngineProtocolError, match="does not implement the RL rollout extension"):
        eng.generate(samples(1), rollout_step=0)


@pytest.mark.gpu
@pytest.mark.skipif(
    not os.environ.get("UNIRL_VLLM_OMNI_URL"), reason="needs a live vLLM-Omni server: UNIRL_VLLM_OMNI_URL"
)
def test_live_vllm_omni_echoes_pinned_sigmas() -> None:
    eng = VLLMOmniEngineConfig(
        url=os.environ["UNIRL_VLLM_OMNI_URL"], sampling=params(height=512, width=512)
    ).build()
    out = eng.generate(samples(2), rollout_step=0)
    assert all(s.part("diffusion").segment.log_probs is not None for s in out)


@pytest.mark.gpu
@pytest.mark.skipif(
    not os.environ.get("UNIRL_SGLANG_DIFFUSION_URL"),
    reason="needs a live SGLang-Diffusion server: UNIRL_SGLANG_DIFFUSION_URL",
)
def test_live_sglang_diffusion_echoes_pinned_sigmas() -> None:
    url = os.environ["UNIRL_SGLANG_DIFFUSION_URL"]
    eng = SGLangDiffusionEngineConfig(url=url, sampling=params(height=512, width=512)).build()
    out = eng.generate(samples(2), rollout_step=0)
    assert all(s.part("diffusion").segment.log_probs is not None for s in out)
