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


SMALL = ["device=cpu", "threads=1", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
         "model.tiny.intermediate_size=64", "sft.steps=3", "sft.batch_size=8", "rl.steps=4",
         "rl.prompts_per_step=2", "rl.samples_per_prompt=4", "rl.geometry.micro_batch_size=8",
         "eval.num_prompts=4", "eval.grid_size=2", "eval.every=3", "checkpoint_every=2"]  # fmt: skip


class Killed(Exception):
    """Stands for kill -9: the run stops at once, no checkpoint, no report."""


def _section(report: str, title: str) -> str:
    return report.split(f"## {title}")[1].split("## ")[0]


@pytest.mark.slow
def test_killed_run_resumes_with_the_whole_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after RL's checkpoint at step 2, once RL step 2 and the eval at step 3 are logged, then
    resumed: report (every stage, the gain, grids, SFT time), metrics rows and the global Python /
    NumPy RNGs are the uninterrupted run's. Each run starts from other global RNG states, as
    separate processes do, and every RL step draws from them."""
    import random

    import numpy as np

    from unirl.apps.run_dir import RunDir
    from unirl.apps.trainers.ar import ARTrainer

    sync = ARTrainer.after_train_step

    def drawing(self: ARTrainer) -> dict[str, float]:
        random.random(), np.random.rand()
        return sync(self)

    monkeypatch.setattr(ARTrainer, "after_train_step", drawing)

    def train(run: Path, process: int) -> int:
        random.seed(process)
        np.random.seed(process)
        return cli.main(["train", "arithmetic_grpo", *SMALL, "--run-dir", str(run)])

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert train(whole, 1) == 0
    want_rng = random.getstate(), np.random.get_state()[1].tolist()
    log = RunDir.log

    def dying(self: RunDir, step: int, metrics: dict[str, float], *, phase: str) -> None:
        if (phase, step) == ("rl", 3):
            raise Killed
        log(self, step, metrics, phase=phase)

    monkeypatch.setattr(RunDir, "log", dying)
    with pytest.raises(Killed):
        train(cut, 2)
    killed = read_metrics(cut / "metrics.jsonl")
    assert [(r["phase"], r["step"]) for r in killed][-2:] == [("rl", 2), ("eval", 3)]  # past the checkpoint
    monkeypatch.setattr(RunDir, "log", log)
    assert train(cut, 3) == 0
    assert (random.getstate(), np.random.get_state()[1].tolist()) == want_rng

    def rows(run: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "time"} for r in read_metrics(run / "metrics.jsonl")]

    assert [(r["phase"], r["step"]) for r in rows(cut)] == [(r["phase"], r["step"]) for r in rows(whole)]
    assert rows(cut) == rows(whole)
    a, b = ((run / "report.md").read_text() for run in (whole, cut))
    for title in ("Held-out evaluation", "Samples"):
        assert _section(b, title) == _section(a, title), title
    for stage in ("init", "sft", "rl@3", "rl"):
        assert f"| {stage} |" in b
    assert "**rl vs sft: accuracy" in b and "![sft](samples/sft.md)" in b
    assert all(f"- {phase}: " in _section(b, "Time") for phase in ("eval", "sft", "rl"))


COSINE = ["rl.lr=1e-3", "rl.scheduler.kind=cosine", "rl.scheduler.total_steps=4",
          "rl.scheduler.min_lr_ratio=0.1"]  # fmt: skip


@pytest.mark.slow
def test_rl_scheduler_runs_over_rl_steps_and_a_resumed_phase_continues_it(tmp_path: Path) -> None:
    def lrs(run: Path) -> list[float]:
        return [r["lr"] for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "rl"]

    whole, split = tmp_path / "whole", tmp_path / "split"
    common = ["arithmetic_grpo", "sft.steps=3", *TINY, *COSINE]
    assert cli.main(["train", *common, "rl.steps=4", "--run-dir", str(whole)]) == 0
    # 1e-3 * (0.1 + 0.9 * (1 + cos(pi k / 4)) / 2) at RL step k, from k = 0 (SFT's 3 steps and
    # the backend's own schedule do not shift it): 1, 0.8682, 0.55, 0.2318 (x 1e-3)
    assert lrs(whole) == pytest.approx([1e-3, 8.682e-4, 5.5e-4, 2.318e-4], rel=1e-3)
    # stopped after 2 RL steps and resumed: the curve goes on from step 2, not from its start
    assert cli.main(["train", *common, "rl.steps=2", "--run-dir", str(split)]) == 0
    assert cli.main(["train", *common, "rl.steps=4", "--run-dir", str(split)]) == 0
    assert lrs(split) == pytest.approx(lrs(whole), rel=1e-9)
