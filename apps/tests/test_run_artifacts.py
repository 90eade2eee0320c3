"""Run directory, plots, sample grids and report: real files with real content."""

import json

import numpy as np
from PIL import Image

from unirl.apps.plots import plot_eval_curve, plot_metrics, running_mean, sample_grid
from unirl.apps.report import write_report
from unirl.apps.run_dir import RunDir, read_metrics


def test_run_dir_logs_jsonl_and_tensorboard(tmp_path):
    rd = RunDir(tmp_path / "run", {"trainer": "diffusion", "rl": {"steps": 2}})
    rd.log(0, {"reward_mean": 0.25, "loss": float("nan")}, phase="rl")
    rd.log(1, {"reward_mean": 0.5, "loss": 0.1}, phase="rl")
    rd.close()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["reward_mean"] for r in rows] == [0.25, 0.5]
    assert "loss" not in rows[0]  # non-finite values are dropped, never written as NaN
    assert (tmp_path / "run" / "config.yaml").read_text().startswith("trainer: diffusion")
    assert any((tmp_path / "run" / "tb").iterdir())


def test_plots_and_report(tmp_path):
    rows = [{"phase": "rl", "step": i, "reward_mean": 0.1 * i, "clip_frac": 0.01} for i in range(12)]
    rows += [
        {"phase": "rl", "step": i, "ratio_mean": 1.0, "ratio_min": 0.9, "ratio_max": 1.1} for i in range(3)
    ]
    rows += [{"phase": "eval", "step": 4, "eval_accuracy": 0.6}]
    paths = plot_metrics(rows, tmp_path / "plots")
    assert {p.name for p in paths} == {"reward.png", "clip.png", "ratio.png"}
    assert Image.open(paths[0]).size[0] > 100
    assert running_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]  # the smoothed train reward
    evals = {
        "init": {"accuracy": 0.0, "reward": 0.2, "pass_at_k": 0.0},
        "sft": {"accuracy": 0.5, "reward": 0.6, "pass_at_k": 0.75, "geneval/count": 0.7},
        "rl@5": {"accuracy": 0.6, "reward": 0.7, "pass_at_k": 0.75, "geneval/count": 0.8},
        "rl": {"accuracy": 0.7, "reward": 0.8, "pass_at_k": 1.0, "geneval/count": 0.9},
    }
    outcomes = {k: {"a": [1.0, 0.0], "b": [1.0, 1.0]} for k in evals}
    curve = plot_eval_curve(evals, {"init": 0, "sft": 0, "rl@5": 5, "rl": 10}, outcomes, tmp_path / "plots")
    assert curve is not None and curve.name == "eval.png" and Image.open(curve).size == (1100, 380)
    imgs = [np.full((8, 8, 3), 40 * i, np.uint8) for i in range(5)]
    grid = sample_grid(imgs, [f"caption {i} r=0.5" for i in range(5)], tmp_path / "grid.png", cols=3)
    w, h = Image.open(grid).size
    assert w == 3 * 180 and h == 2 * (32 + 34)
    rep = write_report(
        tmp_path,
        title="shapes",
        recipe="shapes_flowgrpo",
        evals={"sft": {"accuracy": 0.4}, "rl": {"accuracy": 0.6}},
        timings={"sft": 1.0},
        images=["grid.png"],
    )
    text = rep.read_text()
    assert "accuracy 40.0% -> 60.0% (+20.0 points)" in text
    assert "![reward](plots/reward.png)" in text and "![grid](grid.png)" in text
    json.dumps(rows)
