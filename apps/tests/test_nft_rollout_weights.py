"""DiffusionNFT samples with its EMA (the old policy) only once RL has begun: SFT's probes and
evaluation sample with the policy RL starts from, so the weights at an optimizer step are one set
(the Ray weight sync is keyed by the step: a second set at the same step was never sent)."""

from pathlib import Path

from unirl.apps.config import load
from unirl.apps.distributed.workers import policy_tensors, weights_checksum
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.diffusion import DiffusionTrainer, Recipe


def _rollout_checksum(t: DiffusionTrainer) -> str:
    with t.rollout_weights():
        return weights_checksum(policy_tensors(t.backend))


def test_rollout_weights_are_one_set_per_step_across_the_sft_to_rl_boundary(tmp_path: Path) -> None:
    recipe = load(Recipe, "shapes_nft", ["threads=1", "sft.steps=3", "sft.batch_size=4"])
    run = RunDir(tmp_path / "run", recipe.model_dump(mode="json"))
    try:
        t = DiffusionTrainer(recipe, run)
        assert t.ema_rollout and t.cfg.backend.ema is not None
        train = t.begin_phase("sft")
        for step in range(3):
            train(t.sft_parts(4, step))
        live = weights_checksum(policy_tensors(t.backend))
        with t.backend.ema_weights():
            ema = weights_checksum(policy_tensors(t.backend))
        assert ema != live  # three steps at decay 0.5: the SFT-phase EMA lags the policy
        at_sft_end = _rollout_checksum(t)
        assert at_sft_end == live  # SFT's evaluation: the policy RL starts from
        t.begin_phase("rl", starting=True)  # restarts the EMA at the SFT result
        assert t.backend.global_step == 3 and _rollout_checksum(t) == at_sft_end
        for step in (3, 4):  # the restarted EMA's ramp copies the first update; it lags from the 2nd
            train(t.sft_parts(4, step))
        live = weights_checksum(policy_tensors(t.backend))
        with t.backend.ema_weights():
            ema = weights_checksum(policy_tensors(t.backend))
        assert ema != live and _rollout_checksum(t) == ema  # RL samples with its old policy
        # a process resumed mid-RL (cursor past 0, no stack built yet) samples with the EMA too
        t.stack_phase, t.rl_step = None, 1
        assert _rollout_checksum(t) == ema
        t.rl_step = 0  # ... and before RL, with the policy
        assert _rollout_checksum(t) == live
    finally:
        run.close()
