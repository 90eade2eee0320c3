"""ARTrainer: the causal-LM domain of the shared lifecycle (see base.py).

SFT is token cross-entropy on (prompt, answer) pairs; RL samples with the trainside ARPipeline
(KV-cached decode recording the log-probs of the distribution sampled from) or, with
``rollout.engine.kind: vllm``, a dedicated vLLM engine that receives the trained weights after
every optimizer step (verified: checksum, canary, per-rollout log-prob parity), scores the text with
the reward service (exact match / math verification) and trains the configured GRPO-family
algorithm. Evaluation reports accuracy (per sample) and pass@k (per prompt) on held-out prompts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from unirl.apps.data import SFTPairs, SFTRecords
from unirl.apps.evalstats import distinct_fraction
from unirl.apps.launch import run_trainer
from unirl.apps.loop import PromptRecord, StopFlag, make_samples
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.ar_config import Recipe, TrainsideEngineConfig, engine_model_dir
from unirl.apps.trainers.base import Trainer
from unirl.apps.trainers.components import NoSteps
from unirl.apps.trainers.phases import RunSettings
from unirl.distributed.weightsync import Endpoint, EngineSync, EngineWeightPlane
from unirl.distributed.weightsync.engine import WeightEngine
from unirl.reward.service import RewardService
from unirl.rollout.ar import ARPipeline
from unirl.rollout.ar.vlm_pipeline import VLMPipeline
from unirl.rollout.engines import ClosableEngine, EngineMetrics, RolloutEngine, TrainsideEngine
from unirl.rollout.pipelines import PreparesPrompts
from unirl.train.algorithms import ContextReference, ShapesRewards, UsesReference
from unirl.train.backends import SeparateRolloutCopy
from unirl.train.backends.fsdp import FSDPBackend

if TYPE_CHECKING:
    from unirl.apps.asynchronous.source import RolloutSide
    from unirl.train.backends.megatron.backend import MegatronBackend
from unirl.types import ARSamplingParams, Part, Sample, TextPrimitive, TextSegment

__all__ = ["ARTrainer", "Recipe", "engine_model_dir", "run"]


class VersionedEngine(RolloutEngine, Protocol):
    """A rollout engine that reports the weight version it samples with (trainside, vLLM)."""

    @property
    def weight_version(self) -> int: ...


class ARTrainer(Trainer):
    stage = "ar"
    cfg: Recipe
    pipeline: ARPipeline | VLMPipeline
    backend: FSDPBackend | MegatronBackend
    engine: VersionedEngine  # TrainsideEngine or a dedicated engine (vllm)

    def __init__(self, recipe: Recipe, run_dir: RunDir) -> None:
        super().__init__(recipe, run_dir)
        policy = recipe.build_policy(self.device, stage=self.stage)
        self.bundle, self.pipeline = policy.bundle, policy.pipeline
        self.data = recipe.data.build()
        engine_dir = self._engine_model_dir(recipe)  # before the backend shards / wraps the model
        self.backend = recipe.backend.build(self.bundle.model, device=self.device)
        if self.backend.module is not self.bundle.model:  # megatron: replay on the trained module,
            self.pipeline.replay_model = self.backend.module  # decode on the synced rollout copy
        self.engine = self._build_engine(recipe, engine_dir)
        self.weight_plane: EngineWeightPlane | None = None
        """The ``engine`` weight plane into a dedicated engine (None: trainside samples itself)."""
        if isinstance(self.engine, WeightEngine):
            self.weight_plane = EngineSync().build(
                Endpoint("rollout engine", is_source=True, engine=self.engine)
            )
        self.reward = RewardService.from_config(recipe.reward)
        alg = recipe.rl.algorithm if recipe.rl else None
        self.algorithm = alg.build() if alg is not None else None
        self.steps = self.make_steps(recipe, self.algorithm)
        if alg is not None and isinstance(self.algorithm, UsesReference) and alg.needs_reference:
            self.algorithm.set_reference(ContextReference(self.pipeline, self.backend.reference_weights))

    # ---- the rollout engine (trainside or dedicated) -----------------------------------------
    def _engine_model_dir(self, recipe: Recipe) -> Path | None:
        if recipe.rollout.engine.kind == "trainside":
            return None
        return engine_model_dir(recipe, self.bundle, self.run.root / "engine_init")

    def _build_engine(self, recipe: Recipe, model_dir: Path | None) -> VersionedEngine:
        cfg = recipe.rollout.engine
        if cfg.kind == "trainside":
            return TrainsideEngine(
                self.pipeline,
                weight_version=lambda: self.backend.global_step,
                sampling_context=self.backend.gathered if self._gathered_sampling(cfg) else None,
            )
        if not isinstance(self.pipeline, ARPipeline):  # the recipe rejects a VLM with a dedicated engine
            raise TypeError(f"rollout.engine.kind={cfg.kind!r} needs a text-only AR pipeline")
        return cfg.build(
            self.pipeline,
            model_dir,
            reference=self.pipeline.bundle.model,
            weight_version=self.backend.global_step,
        )

    def _gathered_sampling(self, cfg: TrainsideEngineConfig) -> bool:
        """Sample inside ``backend.gathered()``: static decoders (FSDP: weights gathered once a
        rollout) and a backend with a separate rollout copy (megatron: synced when behind)."""
        return cfg.decoder != "dynamic" or isinstance(self.backend, SeparateRolloutCopy)

    def rollout_side(self) -> RolloutSide:
        """A dedicated engine is the async rollout side itself (fed by the rollout thread);
        trainside sampling gets the base class's rollout copy."""
        if self.weight_plane is None:
            return super().rollout_side()
        from unirl.apps.asynchronous.engine_side import EngineRolloutSide

        return EngineRolloutSide(self)

    def sync_engine(self) -> dict[str, float]:
        """Push the trained weights to a dedicated engine when it is behind (no-op for trainside,
        and during an async RL phase, whose rollout thread feeds the engine: ``EngineRolloutSide``)."""
        version = self.backend.global_step
        if (
            self.weight_plane is None
            or self.async_source is not None
            or version <= self.engine.weight_version
        ):
            return {}
        t0 = time.time()
        if isinstance(self.backend, SeparateRolloutCopy):  # megatron: the engine's parity reference
            self.backend.sync_rollout()
        with self.rollout_weights():
            self.weight_plane.push(self.backend.full_state_dict().items(), version)
        return {"weight_sync/seconds": time.time() - t0, "weight_sync/version": float(version)}

    def after_train_step(self) -> dict[str, float]:
        m = self.sync_engine()
        return m | (self.engine.metrics() if isinstance(self.engine, EngineMetrics) else {})

    def after_phase(self, name: str) -> None:
        self.sync_engine()  # e.g. after SFT: evaluation and RL sample from the SFT weights

    def resume(self) -> bool:
        resumed = super().resume()
        self.sync_engine()
        return resumed

    def run_all(self, mode: str, stop: StopFlag) -> None:
        try:
            super().run_all(mode, stop)
        finally:
            if isinstance(self.engine, ClosableEngine):
                self.engine.close()

    def sft_records(self, batch_size: int, step: int) -> list[PromptRecord]:
        """SFT step ``step``'s (prompt, answer[, images]) records from the data source."""
        seed = self.cfg.seed
        if isinstance(self.data, SFTRecords):  # records with images (a visual-question world)
            return list(self.data.sft_records(batch_size, seed=seed, step=step))
        if not isinstance(self.data, SFTPairs):
            raise ValueError(f"sft needs (prompt, answer) data; data.kind={self.cfg.data.kind!r} has none")
        pairs = self.data.sft_pairs(batch_size, seed=seed, step=step)
        return [PromptRecord(id=f"sft{i}", prompt=p, answer=t) for i, (p, t) in enumerate(pairs)]

    def sft_parts(self, batch_size: int, step: int) -> list[Part]:
        eos = self.bundle.eos_token_ids[0]
        records = self.sft_records(batch_size, step)
        samples = make_samples(
            records, step=step, samples_per_prompt=1, split="train", dataset=self.data.name
        )
        pipeline = self.pipeline
        parts = []
        for s, r in zip(samples, records):
            target = r.answer or ""
            part = Part(
                name=self.stage, sampling_params=self.cfg.sampling, outputs=[TextPrimitive(text=target)]
            )
            # a VLM pipeline prepares the prompt itself, caching the image conditions on the Part
            prompt = (
                pipeline.prepare_prompt(s, part)
                if isinstance(pipeline, PreparesPrompts)
                else pipeline.prompt_ids(s)
            )
            response = [*self.bundle.tokenizer.encode(target, add_special_tokens=False), eos]
            part.segment = TextSegment(prompt_ids=prompt, response_ids=response)
            parts.append(part)
        return parts

    @classmethod
    def make_steps(cls, recipe: RunSettings, algorithm: object) -> ARSteps:
        return ARSteps(cls.stage, algorithm)

    def eval_params(self) -> ARSamplingParams:
        return self.cfg.eval_sampling or self.cfg.sampling.model_copy(update={"top_k": 1})


class ARSteps(NoSteps):
    """The AR domain's model-free steps: the algorithm's reward shaping, completion tables and
    distinct-completion diversity."""

    def __init__(self, stage: str, algorithm: object) -> None:
        self.stage, self.algorithm = stage, algorithm

    def shape_rewards(self, parts: list[Part]) -> None:
        if isinstance(self.algorithm, ShapesRewards):  # DAPO's overlong penalty
            self.algorithm.shape_rewards(parts)

    def sample_diversity(self, samples: list[Sample]) -> float | None:
        """Distinct completions of one prompt / its samples (None for one sample a prompt)."""
        if len(samples) < 2:
            return None
        return distinct_fraction([s.part(self.stage).text or "" for s in samples])

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
