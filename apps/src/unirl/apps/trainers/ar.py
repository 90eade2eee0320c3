"""ARTrainer: the causal-LM domain of the shared lifecycle (see base.py).

SFT is token cross-entropy on (prompt, answer) pairs; RL samples with the trainside ARPipeline
(KV-cached decode recording the log-probs of the distribution sampled from), scores the text with
the reward service (exact match / math verification) and trains the configured GRPO-family
algorithm. Evaluation reports accuracy@k on held-out prompts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.ar_config import Recipe
from unirl.apps.trainers.base import Trainer, run_trainer
from unirl.reward.service import RewardService
from unirl.rollout.ar import ARPipeline
from unirl.rollout.engines import TrainsideEngine
from unirl.types import Part, Sample, TextPrimitive, TextSegment

__all__ = ["ARTrainer", "Recipe", "run"]


class ARTrainer(Trainer):
    stage = "ar"

    def __init__(self, recipe: Recipe, run_dir: RunDir) -> None:
        super().__init__(recipe, run_dir)
        model_cfg = recipe.model.model_copy(update={"device": str(self.device)})
        self.bundle = model_cfg.build()
        self.data = recipe.data.build()
        self.pipeline = ARPipeline(
            self.bundle, recipe.sampling, stage=self.stage, prompt_template=recipe.prompt_template
        )
        self.backend = recipe.backend.build(self.bundle.model, device=self.device)
        self.engine = TrainsideEngine(self.pipeline, weight_version=lambda: self.backend.global_step)
        self.reward = RewardService.local(recipe.reward)
        alg = recipe.rl.algorithm if recipe.rl else None
        self.algorithm = alg.build() if alg is not None else None
        if self.algorithm is not None and getattr(alg, "kl_coef", 0.0):
            from unirl.train.algorithms import ContextReference

            self.algorithm.set_reference(ContextReference(self.pipeline, self.backend.reference_weights))

    def sft_parts(self, batch_size: int, step: int) -> list[Part]:
        if not hasattr(self.data, "sft_pairs"):
            raise ValueError(f"sft needs (prompt, answer) data; data.kind={self.cfg.data.kind!r} has none")
        eos = self.bundle.eos_token_ids[0]
        params = self.cfg.sampling
        parts = []
        for prompt, target in self.data.sft_pairs(batch_size, seed=self.cfg.seed, step=step):
            text = self.cfg.prompt_template.format(prompt=prompt)
            response = [*self.bundle.tokenizer.encode(target, add_special_tokens=False), eos]
            seg = TextSegment(prompt_ids=self.bundle.encode_prompt(text), response_ids=response)
            parts.append(
                Part(
                    name=self.stage, segment=seg, sampling_params=params, outputs=[TextPrimitive(text=target)]
                )
            )
        return parts

    def shape_rewards(self, parts: list[Part]) -> None:
        shaper = getattr(self.algorithm, "shape_rewards", None)
        if callable(shaper):
            shaper(parts)

    def eval_params(self) -> Any:
        return self.cfg.eval_sampling or self.cfg.sampling.model_copy(update={"top_k": 1})

    def save_grid(self, samples: list[Sample], rewards: list[float], path: Path) -> Path:
        lines = [
            f"| {s.prompt} | {s.metadata.answer} | {s.part(self.stage).text!r} | {r:.2f} |"
            for s, r in zip(samples, rewards)
        ]
        path = path.with_suffix(".md")
        path.write_text(
            "| prompt | answer | completion | reward |\n|---|---|---|---|\n" + "\n".join(lines) + "\n"
        )
        return path


def run(recipe: Recipe, run_dir: Path, *, mode: str = "train", recipe_name: str = "") -> int:
    return run_trainer(
        ARTrainer, recipe, run_dir, mode=mode, recipe_name=recipe_name, title=f"unirl AR run: {recipe_name}"
    )
