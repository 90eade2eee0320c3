"""Image RL on the megatron backend: `unirl train sd3_tiny_flowgrpo_megatron` and
`flux_tiny_flowgrpo_megatron` (the MMDiT's blocks on megatron-core) follow the FSDP2 run of the
same recipe step for step, samples
and replays on one module (first-update |log ratio| < 1e-6), and exports a diffusers
folder that loads with diffusers and holds the trained weights."""

from __future__ import annotations

import json
from pathlib import Path

import diffusers
import pytest
import torch

from unirl.apps import cli
from unirl.apps.config import RecipeError, load_dict, validate
from unirl.apps.trainers.diffusion import Recipe

pytest.importorskip("megatron.core")

SHORT = ["rl.steps=2", "threads=1"]
COMPARED = ("loss", "grad_norm", "reward_mean", "ratio_max", "approx_kl")


def _rl_rows(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == "rl"]


@pytest.mark.slow
@pytest.mark.parametrize(("base", "cls"), [("sd3_tiny_flowgrpo", "SD3Transformer2DModel"),
                                           ("flux_tiny_flowgrpo", "FluxTransformer2DModel")])  # fmt: skip
def test_megatron_mmdit_run_follows_fsdp2_and_exports_diffusers(tmp_path: Path, base: str, cls: str) -> None:
    runs = {}
    for recipe in (base, f"{base}_megatron"):
        runs[recipe] = tmp_path / recipe
        assert cli.main(["train", recipe, *SHORT, "--run-dir", str(runs[recipe])]) == 0
    fsdp, meg = _rl_rows(runs[base]), _rl_rows(runs[f"{base}_megatron"])
    assert len(fsdp) == len(meg) == 2
    for f, m in zip(fsdp, meg):
        for k in COMPARED:
            assert m[k] == pytest.approx(f[k], rel=1e-4, abs=1e-7), (m["step"], k)
    first = meg[0]  # on-policy: rollout and replay on the same megatron-core module (fp32 rounding)
    assert max(abs(v) for k, v in first.items() if k.startswith("log_ratio_step_")) < 1e-6
    # the diffusers export of each run: the same trained transformer
    for run in runs.values():
        assert cli.main(["export", str(run), "--format", "diffusers"]) == 0
    load = getattr(diffusers, cls).from_pretrained
    a = load(runs[base] / "export-diffusers" / "transformer").state_dict()
    b = load(runs[f"{base}_megatron"] / "export-diffusers" / "transformer").state_dict()
    assert set(a) == set(b)
    for n, v in a.items():  # 2 AdamW steps of lr 1e-3: float noise amplified in m / sqrt(v)
        torch.testing.assert_close(b[n], v, rtol=0, atol=1e-5)


def test_megatron_needs_an_mmdit_and_trainside_sampling() -> None:
    backend = "backend={kind: megatron, optimizer: {lr: 1.0e-3}, reference: frozen_copy}"
    assert (
        validate(Recipe, load_dict("shapes_flowgrpo", [backend, "model.arch=sd3"])).backend.kind == "megatron"
    )
    with pytest.raises(
        RecipeError, match=r"model.kind='tiny_shapes', model.arch='unet'.*use backend.kind=fsdp"
    ):
        validate(Recipe, load_dict("shapes_flowgrpo", [backend]))
    with pytest.raises(RecipeError, match=r"rollout.engine.kind='sglang'.*use rollout.engine.kind=trainside"):
        validate(
            Recipe,
            load_dict(
                "sd3_tiny_flowgrpo_megatron", ["rollout.engine={kind: sglang, url: 'http://127.0.0.1:1'}"]
            ),
        )
