"""Per-sample accuracy and per-check rates of a shapes run's checkpoint, on train AND held-out captions.

    python experiments/shapes_checks.py RUN_DIR [K] [override ...]      # K samples per caption (8)
    SDE=1 python experiments/shapes_checks.py RUN_DIR                   # RL's SDE sampler instead of the ODE

Tells a policy that is bad everywhere from one that does not generalise: the trainer's evaluation
sees only the held-out captions. Overrides are those the run used (seed=..., sft.steps=...).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from unirl.apps.config import load
from unirl.apps.evalstats import check_rates
from unirl.apps.loop import latest_checkpoint
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.diffusion import DiffusionTrainer, Recipe
from unirl.train.checkpoint import load_checkpoint


def load_policy(run: Path, overrides: list[str], subdir: str) -> DiffusionTrainer:
    """The shapes recipe's trainer (with ``overrides``) holding RUN_DIR's latest checkpoint; its own
    artifacts go to RUN_DIR/subdir."""
    recipe = load(Recipe, "shapes_flowgrpo", overrides)
    torch.set_num_threads(recipe.threads or 2)
    trainer = DiffusionTrainer(recipe, RunDir(run / subdir, recipe.model_dump(mode="json")))
    ckpt = latest_checkpoint(run)
    if ckpt is None:
        raise SystemExit(f"{run} has no checkpoint")
    load_checkpoint(ckpt, trainer.backend)
    return trainer


def main(run: Path, k: int, overrides: list[str]) -> None:
    trainer = load_policy(run, overrides, "checks")
    params = trainer._rollout_params() if os.environ.get("SDE") else trainer.eval_params()
    splits = (("held_out", trainer.data.eval_records()), ("train", trainer.data.train_records()))
    for split, records in splits:
        samples = trainer.sample_prompts(records, k, params)
        # the recipe's reward service (its geneval scorer reports every check), averaged per check
        # as the trainer's own evaluation does
        rates = check_rates(trainer.reward.score_samples(samples, trainer.stage))
        shown = " ".join(f"{name}={v:.3f}" for name, v in rates.items())
        print(f"{split}: {len(samples)} samples ({len(records)} captions x {k}): {shown}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    k = int(args[1]) if len(args) > 1 and args[1].isdigit() else 8
    main(Path(args[0]), k, [a for a in args[1:] if not a.isdigit()])
