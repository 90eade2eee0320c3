"""DiffusionTrainer: the short controller of the diffusion / flow-matching lifecycle.

    SFT:  world (image, caption) -> supervised Parts -> FlowSFT -> backend step
    RL:   prompts -> rollout (trainside engine) -> reward -> advantages -> TrainStack -> step
Evaluation samples held-out prompts with the ODE (eta = 0) and reports the reward and accuracy.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from unirl.apps.data import draw
from unirl.apps.loop import StopFlag, latest_checkpoint, make_samples
from unirl.apps.plots import plot_metrics, sample_grid
from unirl.apps.progress import PhaseProgress
from unirl.apps.report import write_report
from unirl.apps.run_dir import RunDir, read_metrics
from unirl.apps.trainers.diffusion_config import Recipe
from unirl.reward.service import RewardService
from unirl.rollout.engines import TrainsideEngine
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.train.geometry import BatchGeometry
from unirl.train.stack import TrainStack
from unirl.types import LatentTrajectory, Part, Sample, compute_sample_advantages, to_numpy

log = logging.getLogger("unirl")
STAGE = "diffusion"

__all__ = ["DiffusionTrainer", "Recipe", "run"]


def set_base_lr(backend: Any, lr: float) -> None:
    """Change a phase's base learning rate; the backend's schedule keeps shaping it."""
    sched = backend.scheduler
    sched.base_lrs = [lr for _ in sched.base_lrs]
    for g, f in zip(backend.optimizer.param_groups, sched.lr_lambdas):
        g["lr"] = lr * f(sched.last_epoch)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class DiffusionTrainer:
    def __init__(self, recipe: Recipe, run_dir: RunDir) -> None:
        self.cfg, self.run = recipe, run_dir
        if recipe.threads:
            torch.set_num_threads(recipe.threads)
        torch.manual_seed(recipe.seed)
        self.device = pick_device(recipe.device)
        self.bundle = recipe.model.build(self.device, recipe.seed)
        self.data = recipe.data.build()
        alg = recipe.rl.algorithm if recipe.rl else None
        self.pipeline = FlowMatchPipeline(
            self.bundle,
            stage=STAGE,
            default_params=self._rollout_params(),
            record_old_means=bool(alg is not None and alg.kind == "flow_dppo"),
        )
        self.backend = recipe.backend.build(self.bundle.transformer, device=self.device)
        self.engine = TrainsideEngine(self.pipeline, weight_version=lambda: self.backend.global_step)
        self.reward = RewardService.local(recipe.reward)
        self.algorithm = alg.build() if alg is not None else None
        self._wire_algorithm()
        self.rl_step = 0
        self.evals: dict[str, dict[str, float]] = {}
        self.timings: dict[str, float] = {}
        self.grids: list[str] = []

    # ---- wiring -------------------------------------------------------------------------------
    def _rollout_params(self) -> Any:
        params = self.cfg.sampling
        alg = self.cfg.rl.algorithm if self.cfg.rl else None
        overrides = getattr(alg, "sampling_overrides", None)
        if callable(overrides):
            params = params.model_copy(update=overrides())
        return params

    def _wire_algorithm(self) -> None:
        alg = self.algorithm
        if alg is None:
            return
        if getattr(getattr(alg, "config", None), "kl_coef", 0.0):
            from unirl.train.algorithms import ContextReference

            alg.set_reference(ContextReference(self.pipeline, self.backend.reference_weights))
        if hasattr(alg, "set_old_policy"):
            alg.set_old_policy(self.backend.ema_weights)

    @property
    def ema_rollout(self) -> bool:
        return self.cfg.rl is not None and self.cfg.rl.algorithm.kind == "diffusion_nft"

    def _set_lr(self, lr: float | None) -> None:
        if lr is not None:
            set_base_lr(self.backend, lr)

    # ---- phases -------------------------------------------------------------------------------
    def sft(self, stop: StopFlag) -> None:
        phase = self.cfg.sft
        if phase is None or phase.steps == 0:
            return
        if not hasattr(self.data, "sft_examples"):
            raise ValueError(f"sft needs (image, caption) data; data.kind={self.cfg.data.kind!r} has none")
        self._set_lr(phase.lr)
        geometry = BatchGeometry(micro_batch_size=phase.micro_batch_size or phase.batch_size)
        stack = TrainStack(self.backend, phase.algorithm.build(), self.pipeline, geometry)
        t0 = time.time()
        with PhaseProgress("sft", phase.steps) as bar:
            for step in range(phase.steps):
                images, captions = self.data.sft_examples(phase.batch_size, seed=self.cfg.seed, step=step)
                parts = self._sft_parts(images, captions)
                m = stack.train_on(parts)
                self.run.log(step, m, phase="sft")
                bar.advance(loss=m.get("loss", float("nan")))
                if stop.stop:
                    break
        self.timings["sft"] = time.time() - t0

    def _sft_parts(self, images_BHWC: np.ndarray, captions: list[str]) -> list[Part]:
        x0 = self.bundle.encode_images(torch.from_numpy(images_BHWC).to(self.device)).float().cpu()
        conds = self.bundle.encode_prompts(captions)
        return [
            Part.model_construct(
                name=STAGE,
                segment=LatentTrajectory.model_construct(
                    kind="latent", latents=x[None], positions=[1], sigmas=[1.0, 0.0], sde_indices=[]
                ),
                conditions=c,
                outputs=[],
                status="completed",
            )
            for x, c in zip(x0, conds)
        ]

    def rollout(self, samples: list[Sample], step: int) -> list[Sample]:
        with self.backend.ema_weights() if self.ema_rollout else nullcontext():
            return self.engine.generate(samples, rollout_step=step)

    def rl(self, stop: StopFlag) -> None:
        phase = self.cfg.rl
        if phase is None or phase.steps == 0 or self.algorithm is None:
            return
        self._set_lr(phase.lr)
        stack = TrainStack(self.backend, self.algorithm, self.pipeline, phase.geometry)
        train = self.data.train_records()
        t0 = time.time()
        with PhaseProgress("rl", phase.steps - self.rl_step) as bar:
            while self.rl_step < phase.steps and not stop.stop:
                step = self.rl_step
                records = draw(train, phase.prompts_per_step, seed=self.cfg.seed, step=step)
                samples = make_samples(
                    records, step=step, samples_per_prompt=phase.samples_per_prompt, split="train", dataset=self.data.name
                )
                samples = self.rollout(samples, step)
                rewards = self.reward.score_samples(samples, STAGE)
                compute_sample_advantages(samples, STAGE, phase.advantage)
                m = stack.train_on([s.part(STAGE) for s in samples])
                m["reward_mean"] = float(np.mean([r.total for r in rewards]))
                m["reward_std"] = float(np.std([r.total for r in rewards]))
                self.run.log(step, m, phase="rl")
                bar.advance(reward=m["reward_mean"], loss=m.get("loss", float("nan")))
                self.rl_step += 1
                if self.cfg.eval.every and self.rl_step % self.cfg.eval.every == 0 and self.rl_step < phase.steps:
                    self.evaluate(f"rl@{self.rl_step}", step=self.rl_step)
                if self.cfg.checkpoint_every and self.rl_step % self.cfg.checkpoint_every == 0:
                    self.save()
        self.timings["rl"] = self.timings.get("rl", 0.0) + time.time() - t0

    # ---- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, name: str, *, step: int, grid: bool = False) -> dict[str, float]:
        ev = self.cfg.eval
        records = self.data.eval_records()[: ev.num_prompts]
        if not records:
            return {}
        samples = make_samples(records, step=0, samples_per_prompt=1, split="eval", dataset=self.data.name)
        params = self.cfg.sampling.model_copy(update={"eta": 0.0, "sde_strategy": "ode"})
        for s in samples:
            s.ensure_part(STAGE).sampling_params = params
        samples = self.engine.generate(samples, rollout_step=0)
        rewards = [r.total for r in self.reward.score_samples(samples, STAGE)]
        m = {"reward": float(np.mean(rewards)), "accuracy": float(np.mean([r >= ev.success_threshold for r in rewards]))}
        self.evals[name] = m
        self.run.log(step, {f"eval_{k}": v for k, v in m.items()}, phase="eval")
        log.info("eval %s: reward=%.3f accuracy=%.1f%%", name, m["reward"], 100 * m["accuracy"])
        if grid and ev.grid_size:
            imgs = [to_numpy(s.part(STAGE).outputs[0].pixels) for s in samples[: ev.grid_size]]
            caps = [f"{s.prompt} | r={r:.2f}" for s, r in zip(samples, rewards)]
            path = sample_grid(imgs, caps[: len(imgs)], self.run.samples / f"{name.replace('@', '_')}.png")
            self.grids.append(str(path.relative_to(self.run.root)))
        return m

    # ---- checkpoints --------------------------------------------------------------------------
    def save(self) -> None:
        from unirl.train.checkpoint import save_checkpoint

        save_checkpoint(self.run.checkpoints / "latest", self.backend, extra={"rl_step": self.rl_step})

    def resume(self) -> bool:
        from unirl.train.checkpoint import load_checkpoint

        ckpt = latest_checkpoint(self.run.root)
        if ckpt is None:
            return False
        extra = load_checkpoint(ckpt, self.backend)
        self.rl_step = int(extra.get("rl_step", 0))
        log.info("resumed from %s at rl step %d", ckpt, self.rl_step)
        return True


def run(recipe: Recipe, run_dir: Path, *, mode: str = "train", recipe_name: str = "") -> int:
    rd = RunDir(run_dir, recipe.model_dump(mode="json"))
    log.info("run directory: %s", rd.root)
    trainer = DiffusionTrainer(recipe, rd)
    stop = StopFlag()
    resumed = trainer.resume()
    with stop.installed():
        if mode == "eval":
            trainer.evaluate("eval", step=trainer.rl_step, grid=True)
        else:
            if not resumed:
                if mode == "sft" or recipe.sft is not None:
                    if recipe.sft is not None and recipe.sft.steps:
                        trainer.evaluate("init", step=0)
                    trainer.sft(stop)
                trainer.evaluate("sft" if recipe.sft else "init", step=0, grid=True)
            if mode == "train" and not stop.stop:
                trainer.rl(stop)
                trainer.evaluate("rl", step=trainer.rl_step, grid=True)
            trainer.save()
    plot_metrics(read_metrics(rd.root / "metrics.jsonl"), rd.plots)
    report = write_report(
        rd.root,
        title=f"unirl diffusion run: {recipe_name}",
        recipe=recipe_name,
        evals=trainer.evals,
        timings=trainer.timings,
        images=trainer.grids,
        notes=["stopped early by the user (checkpoint saved)"] if stop.stop else None,
    )
    rd.close()
    log.info("report: %s", report)
    return 130 if stop.stop else 0
