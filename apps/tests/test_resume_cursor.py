"""A run resumes where it stopped, in SFT as in RL: the checkpoint carries the data cursor."""

from pathlib import Path

import pytest

from unirl.apps import cli
from unirl.apps.run_dir import read_metrics

TINY = ["rl.steps=2", "rl.prompts_per_step=4", "rl.samples_per_prompt=4", "rl.geometry.micro_batch_size=16",
        "sft.batch_size=16", "eval.num_prompts=4", "eval.grid_size=2", "threads=1"]  # fmt: skip


@pytest.mark.slow
def test_sft_then_train_continues_sft_from_its_cursor(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert cli.main(["sft", "arithmetic_grpo", "sft.steps=3", *TINY, "--run-dir", str(run)]) == 0
    # a longer SFT phase in the same run directory: steps 3..4 run, then RL
    assert cli.main(["train", "arithmetic_grpo", "sft.steps=5", *TINY, "--run-dir", str(run)]) == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows if r["phase"] == "sft"] == [0, 1, 2, 3, 4]
    assert [r["step"] for r in rows if r["phase"] == "rl"] == [0, 1]
    assert rows[-1]["phase"] == "eval"


@pytest.mark.slow
def test_rl_reset_optimizer_applies_once_when_rl_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from unirl.train.backends.fsdp import FSDPBackend

    calls: list[int] = []
    reset = FSDPBackend.reset_optimizer

    def spy(self: FSDPBackend) -> None:
        calls.append(self.global_step)
        reset(self)

    monkeypatch.setattr(FSDPBackend, "reset_optimizer", spy)
    run = tmp_path / "run"
    args = ["arithmetic_grpo", "sft.steps=3", *TINY, "rl.reset_optimizer=true", "--run-dir", str(run)]
    assert cli.main(["train", *args]) == 0
    assert calls == [3]  # once, after SFT's 3 optimizer steps, before RL's first
    # resumed at rl step 2 with a longer RL phase: the checkpointed optimizer state is kept
    assert cli.main(["train", *args[:-2], "rl.steps=4", "--run-dir", str(run)]) == 0
    assert calls == [3]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "rl"] == [0, 1, 2, 3]


SHAPES_KL = ["sft.steps=30", "sft.batch_size=8", "rl.prompts_per_step=2", "rl.samples_per_prompt=4",
             "rl.geometry.micro_batch_size=8", "rl.geometry.mini_batch_size=8", "eval.num_prompts=2",
             "eval.samples_per_prompt=1", "eval.grid_size=0", "threads=1", "rl.reset_optimizer=true",
             "rl.lr=3e-3", "rl.algorithm.kl_coef=0.1", "backend.reference=frozen_copy"]  # fmt: skip


@pytest.mark.slow
def test_kl_reference_is_the_policy_rl_starts_from_and_survives_resume(tmp_path: Path) -> None:
    def kls(run: Path) -> list[float]:
        return [r["kl"] for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "rl"]

    whole, split = tmp_path / "whole", tmp_path / "split"
    assert cli.main(["train", "shapes_flowgrpo", *SHAPES_KL, "rl.steps=4", "--run-dir", str(whole)]) == 0
    # the first RL update is taken against the SFT result itself (not the pre-SFT init): KL 0
    first, *_, last = kls(whole)
    assert first == 0.0 and last > 0  # and the policy moves away from it
    # stopped after 2 RL steps and resumed: the checkpoint carried the reference, so the KL of
    # steps 2 and 3 is the uninterrupted run's (a build-time reference would make it far larger)
    assert cli.main(["train", "shapes_flowgrpo", *SHAPES_KL, "rl.steps=2", "--run-dir", str(split)]) == 0
    assert cli.main(["train", "shapes_flowgrpo", *SHAPES_KL, "rl.steps=4", "--run-dir", str(split)]) == 0
    assert kls(split) == pytest.approx(kls(whole), rel=1e-4, abs=1e-12)
