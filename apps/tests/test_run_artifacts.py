"""Run directory, plots, sample grids and report: real files with real content."""

import json

import numpy as np
from PIL import Image

from unirl.apps.plots import plot_eval_curve, plot_metrics, running_mean, sample_grid
from unirl.apps.report import sft_stop_lines, write_report
from unirl.apps.run_dir import RunDir, read_metrics
from unirl.apps.trainers.phases import SFTStopConfig


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


def _tb_scalars(tb_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_truncate_keeps_the_checkpoints_rows_in_jsonl_and_tensorboard(tmp_path):
    """A resume drops the rows logged after its checkpoint: from metrics.jsonl (atomically) and from
    TensorBoard, per phase (purge_step would also hide the SFT steps past the RL step)."""
    rd = RunDir(tmp_path / "run")
    for i in range(5):
        rd.log(i, {"loss": 1.0 - 0.1 * i}, phase="sft")
    rd.log(0, {"accuracy": 0.5}, phase="eval")
    rd.log(0, {"reward_mean": 0.1}, phase="rl")
    kept = rd.rows
    assert kept == 7
    rd.log(1, {"reward_mean": 0.2}, phase="rl")  # after the checkpoint: the resumed run redoes it
    rd.log(1, {"accuracy": 0.6}, phase="eval")
    rd.close()
    with (tmp_path / "run" / "metrics.jsonl").open("a") as f:
        f.write('{"phase": "rl", "st')  # a row a kill cut short
    rd = RunDir(tmp_path / "run")
    assert rd.rows == 9
    assert rd.truncate(kept) == 2 and rd.rows == kept
    rd.log(1, {"reward_mean": 0.25}, phase="rl")
    rd.close()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [(r["phase"], r["step"]) for r in rows] == [("sft", i) for i in range(5)] + [
        ("eval", 0), ("rl", 0), ("rl", 1)
    ]  # fmt: skip
    assert rows[-1]["reward_mean"] == 0.25
    tb = _tb_scalars(tmp_path / "run" / "tb")
    assert [s for s, _ in tb["sft/loss"]] == [0, 1, 2, 3, 4]
    assert tb["rl/reward_mean"] == [(0, 0.10000000149011612), (1, 0.25)]
    assert [s for s, _ in tb["eval/accuracy"]] == [0]
    assert not (tmp_path / "run" / "tb.old").exists() and not (tmp_path / "run" / "tb.rebuilt").exists()
    rd = RunDir(tmp_path / "run", tensorboard=False)
    assert rd.truncate(rd.rows) == 0  # nothing past the checkpoint: the file is left as it is
    rd.close()


def test_run_state_roundtrips_through_json_with_the_global_rngs(tmp_path):
    """The report's history and the Python / NumPy RNGs survive the checkpoint's sorted-key JSON:
    order of stages and prompts kept, RNG draws after a restore equal to those without one."""
    import random
    from types import SimpleNamespace

    from unirl.apps.run_state import capture, restore

    def trainer(**kw):
        base = dict(evals={}, eval_steps={}, eval_outcomes={}, timings={}, grids=[], rl_started=None,
                    run=SimpleNamespace(rows=0, root=tmp_path), rl_step=4, cfg=SimpleNamespace(rl=None))  # fmt: skip
        return SimpleNamespace(**(base | kw))

    src = trainer(
        evals={"init": {"reward": 0.1, "accuracy": 0.0}, "sft": {"accuracy": 0.5}, "rl@2": {"accuracy": 0.6}},
        eval_steps={"init": 0, "sft": 0, "rl@2": 2},
        eval_outcomes={"sft": {"z": [1.0], "a": [0.0, 1.0]}},
        timings={"sft": 3.0, "eval": 1.0},
        grids=["samples/sft.png"],
        run=SimpleNamespace(rows=17, root=tmp_path),
        rl_started=0.0,  # mid-RL: the RL phase's time so far is saved
    )
    random.seed(5)
    np.random.seed(6)
    random.random(), np.random.rand(), np.random.randn()  # mid-stream states (numpy's cached gaussian)
    extra = json.loads(json.dumps(capture(src), sort_keys=True))
    want = (random.random(), np.random.rand(3).tolist(), np.random.randn())
    random.seed(0)
    np.random.seed(0)
    dst = trainer()
    restore(dst, extra)
    assert (random.random(), np.random.rand(3).tolist(), np.random.randn()) == want
    assert list(dst.evals) == ["init", "sft", "rl@2"] and dst.evals["init"] == src.evals["init"]
    assert dst.eval_steps == src.eval_steps and list(dst.eval_outcomes["sft"]) == ["z", "a"]
    assert list(dst.timings)[:2] == ["sft", "eval"] and dst.timings["rl"] > 1e9
    assert dst.grids == ["samples/sft.png"] and dst.checkpoint_rows == 17
    # the final evaluation of a run that goes on (stopped early, or more rl.steps): named by its step
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "rl.png").write_bytes(b"png")
    src.evals["rl"], src.eval_steps["rl"], src.grids = {"accuracy": 0.7}, 3, ["samples/rl.png"]
    dst = trainer(cfg=SimpleNamespace(rl=SimpleNamespace(steps=6)), rl_step=3)
    restore(dst, json.loads(json.dumps(capture(src), sort_keys=True)))
    assert list(dst.evals) == ["init", "sft", "rl@2", "rl@3"] and dst.eval_steps["rl@3"] == 3
    assert dst.grids == ["samples/rl@3.png"] and (tmp_path / "samples" / "rl@3.png").is_file()


def test_report_says_where_sft_stopped_and_why(tmp_path):
    """`sft.stop`: the report names the step, the probe's value against the level and the probe size;
    a run whose probes never reached the level says it ran to its step limit, with the best probe."""
    stop = SFTStopConfig(metric="geneval/relation", at_least=0.45, every=100, min_steps=1000, num_prompts=64)
    rows = [
        {"phase": "sft_probe", "step": s, "probe_geneval/relation": v} for s, v in [(1000, 0.2), (1100, 0.38)]
    ]
    assert sft_stop_lines(rows, stop)[2] == (
        "- SFT ran to its step limit: geneval/relation stayed below 0.45 on 64 training prompts x 2 "
        "(best 0.380 at step 1100, 2 probes)"
    )
    rows.append({"phase": "sft_probe", "step": 1200, "probe_geneval/relation": 0.5})
    text = write_report(
        tmp_path, title="t", recipe="r", evals={}, timings={}, rows=rows, sft_stop=stop
    ).read_text()
    assert (
        "- SFT ended at step 1200: geneval/relation 0.500 >= 0.45 on 64 training prompts x 2 (3 probes from step 1000)"
        in text
    )
    assert sft_stop_lines(rows, None) == [] and sft_stop_lines([], stop) == []
