"""`rollout.engine` of a diffusion recipe: the HTTP engines (sglang, vllm_omni) reached through `unirl train`.

The stand-in servers listen on loopback and speak each engine's wire format (SGLang-Diffusion: a
safetensors blob; vLLM-Omni: JSON with encoded tensors). They compute real samples: a trainside
``FlowMatchPipeline`` over their own copy of the recipe's tiny SD3 (built from the same config and
seed, so it starts with the trainer's weights), on the prompt, pinned sigmas, SDE steps, eta and
guidance of each request. What the run checks is the trainer's side: the sigma echo, the parity
of the server's log-probs with the trainer's replay, and (the server receiving no weights) the
parity guard failing once the trainer's policy moved.
"""

from __future__ import annotations

import base64
import io
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from unirl.apps.cli import main
from unirl.apps.config import load, load_dict
from unirl.apps.run_dir import read_metrics
from unirl.apps.trainers.diffusion_config import Recipe
from unirl.rollout.engines import LogProbParityError, SigmaEchoError
from unirl.rollout.engines.testing import WireServer
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.rollout.schedules import static_shifted_sigmas
from unirl.types import DiffusionSamplingParams, Sample, TextPrimitive, encode_tensor

RECIPE = "sd3_tiny_flowgrpo"
STRATEGY = {"sde": "flow_sde", "cps": "cps", "dance": "dance_sde"}  # wire sde_type -> ours
ROUTES = {"sglang": "/v1/rl/generate", "vllm_omni": "/v1/images/generations"}  # each engine's generate route


class StandInServer:
    """A loopback diffusion server (`WireServer`) answering the ``kind`` engine's generate route."""

    def __init__(self, kind: str, *, ignore_sigmas: bool = False) -> None:
        recipe = load(Recipe, RECIPE)
        self.bundle = recipe.model.build(torch.device("cpu"), recipe.seed)  # the trainer's initial weights
        self.kind, self.ignore_sigmas = kind, ignore_sigmas
        self.lock = threading.Lock()  # one sample at a time through the (not thread-safe) pipeline
        handler = self.sglang if kind == "sglang" else self.vllm_omni
        self.wire = WireServer({ROUTES[kind]: lambda body: (200, handler(body))})
        self.url = self.wire.url

    @property
    def calls(self) -> int:
        return len(self.wire.calls)

    def sample(self, prompt: str, body: dict[str, Any], rl: dict[str, Any]) -> Any:
        """The trainside pipeline on the request: its Part (segment with log-probs, decoded image)."""
        n = body["num_inference_steps"]
        sigmas = static_shifted_sigmas(n, 1.0) if self.ignore_sigmas else rl["sigmas"]
        p = DiffusionSamplingParams(
            num_steps=n, guidance_scale=body["guidance_scale"], negative_prompt=body["negative_prompt"],
            height=body["height"], width=body["width"], eta=rl["noise_level"], sigmas=sigmas,
            sde_strategy=STRATEGY[rl["sde_type"]] if rl["sde_indices"] else "ode",
        )  # fmt: skip
        assert p.resolve_sde_indices(0) == rl["sde_indices"], "stand-in: every step or none is an SDE step"
        s = Sample(id=f"seed{body['seed']}", group_id="g", inputs=[TextPrimitive(text=prompt)])
        s.ensure_part("diffusion").sampling_params = p
        with self.lock:
            return (
                FlowMatchPipeline(self.bundle, default_params=p)
                .generate([s], rollout_step=0)[0]
                .part("diffusion")
            )

    def sglang(self, body: dict[str, Any]) -> bytes:
        from safetensors.torch import save

        part = self.sample(body["prompts"][0], body, body)
        seg = part.segment
        dense = torch.zeros(seg.num_steps + 1, *seg.latents.shape[1:])
        for i, pos in enumerate(seg.positions):
            dense[pos] = seg.latents[i]
        tensors = {
            "trajectory_latents": dense[None],
            "trajectory_timesteps": torch.tensor(seg.sigmas, dtype=torch.float32),
            "decoded_output": torch.as_tensor(np.asarray(part.outputs[0].pixels))[None],
        }
        if seg.log_probs is not None:
            tensors["trajectory_log_probs"] = seg.log_probs[None]
        meta = {"timestep_type": "sigma", "sde_indices": json.dumps(body["sde_indices"])}
        return save(tensors, metadata=meta)

    def vllm_omni(self, body: dict[str, Any]) -> dict[str, Any]:
        from PIL import Image

        rl = body["extra_args"]["rl_rollout"]
        w, h = (int(x) for x in body["size"].split("x"))
        part = self.sample(body["prompt"], body | {"width": w, "height": h}, rl)
        buf = io.BytesIO()
        Image.fromarray(np.asarray(part.outputs[0].pixels)).save(buf, format="PNG")
        seg = part.segment
        traj = {"sigmas": seg.sigmas, "sde_indices": seg.sde_indices, "positions": seg.positions,
                "latents": encode_tensor(seg.latents)}  # fmt: skip
        if seg.log_probs is not None:
            traj["log_probs"] = encode_tensor(seg.log_probs)
        return {
            "created": 0,
            "data": [{"b64_json": base64.b64encode(buf.getvalue()).decode(), "rl_rollout": traj}],
        }

    def close(self) -> None:
        self.wire.close()


def train(server: StandInServer, run: Path, *overrides: str) -> int:
    args = [f"rollout.engine.kind={server.kind}", f"rollout.engine.url={server.url}", "threads=1", *overrides]
    return main(["train", RECIPE, *args, "--run-dir", str(run)])


@pytest.mark.parametrize("kind", ["sglang", "vllm_omni"])
def test_remote_engine_trains_through_the_recipe_with_parity(kind: str, tmp_path: Path) -> None:
    server = StandInServer(kind)
    try:
        assert train(server, tmp_path / "run", "rl.steps=1", "rollout.parity_bound=1.0e-5") == 0
    finally:
        server.close()
    rl = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "rl"]
    assert len(rl) == 1
    # every scored SDE step of the server's 8 samples was replayed by the trainer, to round-off
    assert rl[0]["parity/count"] == 8 * 6 and rl[0]["parity/max_abs_diff"] < 1e-5
    assert rl[0]["engine/sigma_echo_max_dev"] < 1e-6
    assert server.calls == 8 + 2 * 2  # RL: 2 prompts x 4 samples; the init and rl evaluations: 2 prompts x 1


def test_parity_guard_stops_a_run_whose_server_fell_behind(tmp_path: Path) -> None:
    """The server receives no weights: once the trainer stepped, its replay differs from the server's."""
    server = StandInServer("sglang")
    try:
        with pytest.raises(LogProbParityError, match="engine vs trainer log-probs differ"):
            train(server, tmp_path / "run", "rl.steps=2", "backend.optimizer.lr=0.05",
                  "rl.algorithm.clip_range=0.2", "rollout.parity_bound=1.0e-5")  # fmt: skip
    finally:
        server.close()
    rl = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "rl"]
    assert len(rl) == 1 and rl[0]["parity/max_abs_diff"] < 1e-5  # step 0 matched; step 1's rollout failed


def test_server_ignoring_the_pinned_sigmas_fails_the_run(tmp_path: Path) -> None:
    server = StandInServer("sglang", ignore_sigmas=True)
    try:
        with pytest.raises(SigmaEchoError, match="differ from the pinned schedule"):
            train(server, tmp_path / "run", "rl.steps=1")
    finally:
        server.close()


def recipe(**rollout: Any) -> dict[str, Any]:
    return load_dict(RECIPE) | {"rollout": rollout}


def test_default_engine_is_trainside_and_impossible_combos_name_the_fix() -> None:
    assert Recipe.model_validate(recipe()).rollout.engine.kind == "trainside"
    url = "http://127.0.0.1:1"
    assert (
        Recipe.model_validate(recipe(engine={"kind": "vllm_omni", "url": url})).rollout.engine.kind
        == "vllm_omni"
    )
    with pytest.raises(
        ValidationError, match=r"rollout.engine.kind='sglang' needs rollout.engine.url.*got None"
    ):
        Recipe.model_validate(recipe(engine={"kind": "sglang"}))
    with pytest.raises(ValidationError, match="'trainside', 'sglang', 'vllm_omni'"):
        Recipe.model_validate(recipe(engine={"kind": "sgl"}))
    with pytest.raises(ValidationError, match=r"rollout.engine.sampling=.*drop rollout.engine.sampling"):
        Recipe.model_validate(
            recipe(
                engine={"kind": "sglang", "url": url, "sampling": {"num_steps": 2, "height": 16, "width": 16}}
            )
        )
    lora = {"r": 4, "alpha": 8, "target_modules": ["to_q"]}
    base = recipe(engine={"kind": "sglang", "url": url})
    with pytest.raises(
        ValidationError, match="kind='sglang' with backend.lora is not supported.*drop backend.lora"
    ):
        Recipe.model_validate(base | {"backend": base["backend"] | {"lora": lora}})
    with pytest.raises(ValidationError, match="with layout.kind='ray' is not supported"):
        Recipe.model_validate(base | {"layout": {"kind": "ray"}})
    with pytest.raises(ValidationError, match="sampling.sde_strategy='dance_sde'.*sglang"):
        Recipe.model_validate(base | {"sampling": base["sampling"] | {"sde_strategy": "dance_sde"}})
