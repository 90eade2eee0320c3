"""Plots (PNG) from metrics.jsonl, and sample grids with prompts and rewards."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# (file name, title, metric keys that may appear, phases to draw)
# The held-out evaluations have their own figure (`plot_eval_curve`: eval.png).
PANELS: list[tuple[str, str, tuple[str, ...]]] = [
    ("reward.png", "reward (train batches)", ("reward_mean",)),
    ("loss.png", "loss", ("loss",)),
    ("kl.png", "KL: approx_kl to the rollout policy, kl to the reference", ("approx_kl", "kl")),
    ("clip.png", "clip fraction", ("clip_frac",)),
    ("ratio.png", "importance ratio (min / mean / max per step)", ("ratio_min", "ratio_mean", "ratio_max")),
    ("async.png", "async: staleness of the trained batch (versions)", ("async/staleness",)),
    (
        "async_wait.png",
        "async: trainer's wait for a batch, rollout time (s)",
        ("async/train_wait_s", "async/rollout_s"),
    ),
    (
        "is_weight.png",
        "off-policy weights exp(old_logprobs - behavior_logprobs): mean, raw max, clipped fraction",
        ("is_weight_mean", "is_weight_raw_max", "is_weight_clipped_frac"),
    ),
]
SMOOTH_FROM = 10
"""A series of at least this many points is drawn faintly with its running mean over it."""


def running_mean(ys: Sequence[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each point (fewer at the start)."""
    c = np.cumsum(np.asarray(ys, dtype=float))
    out = []
    for i in range(len(ys)):
        lo = i - window
        out.append((c[i] - (c[lo] if lo >= 0 else 0.0)) / (i - max(lo, -1)))
    return out


def plot_metrics(rows: Sequence[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """One PNG per panel that has data; returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, title, keys in PANELS:
        series: dict[str, tuple[list[float], list[float]]] = {}
        for r in rows:
            for k in keys:
                if k in r:
                    xs, ys = series.setdefault(f"{r['phase']}/{k}", ([], []))
                    xs.append(r["step"])
                    ys.append(r[k])
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        for label, (xs, ys) in series.items():
            if len(xs) >= SMOOTH_FROM:
                (raw,) = ax.plot(xs, ys, alpha=0.3, lw=1)
                window = max(3, len(xs) // 10)
                ax.plot(
                    xs, running_mean(ys, window), color=raw.get_color(), label=f"{label} (mean of {window})"
                )
            else:
                ax.plot(xs, ys, marker="o", ms=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / fname
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def plot_eval_curve(
    evals: dict[str, dict[str, float]],
    steps: dict[str, int],
    outcomes: dict[str, dict[str, list[float]]],
    out_dir: str | Path,
) -> Path | None:
    """eval.png: held-out accuracy (95% bootstrap interval over the prompts) and pass@k at each
    evaluation during RL, against the RL step, with the untrained and SFT levels as lines; beside
    it the checker reward, each check's rate and the sample diversity over the same steps."""
    if not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from unirl.apps.evalstats import bootstrap_interval, made_by_rl

    # the curve starts at the SFT result (RL step 0), then every evaluation RL made (rl@N, rl, eval);
    # the others are levels: init, sft and the baselines beside a stage (e.g. PE's sft_unenhanced)
    rl_points = [k for k in evals if made_by_rl(k)]
    curve = (["sft"] if "sft" in evals else []) + rl_points
    levels = [k for k in evals if k not in rl_points]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8), dpi=100)
    styles = {"init": (":", "grey"), "sft": ("--", "grey")}
    others = ("tab:red", "tab:green", "tab:purple", "tab:brown")
    for i, name in enumerate(k for k in levels if k not in styles):
        styles[name] = ("-.", others[i % len(others)])
    for name in levels:
        style, colour = styles[name]
        ax.axhline(evals[name]["accuracy"], ls=style, color=colour, lw=1, label=f"{name} accuracy")
        bx.axhline(evals[name]["reward"], ls=style, color=colour, lw=1, label=f"{name} reward")
    if curve:
        xs = [steps.get(k, 0) for k in curve]
        acc = [evals[k]["accuracy"] for k in curve]
        lo, hi = [], []
        for k, a in zip(curve, acc):
            w = bootstrap_interval(outcomes.get(k, {}))
            lo.append(max(0.0, a - w[0]))
            hi.append(max(0.0, w[1] - a))
        ax.errorbar(xs, acc, yerr=[lo, hi], marker="o", ms=4, capsize=3, label="accuracy (95% interval)")
        ax.plot(xs, [evals[k]["pass_at_k"] for k in curve], marker="s", ms=3, label="pass@k")
        keys = ["reward", "diversity", *sorted({m for k in curve for m in evals[k] if "/" in m})]
        for m in keys:
            if all(m in evals[k] for k in curve):
                bx.plot(xs, [evals[k][m] for k in curve], marker="o", ms=3, label=m)
    ax.set_title("held-out accuracy during RL")
    bx.set_title("held-out reward, per-check rates, diversity")
    for a in (ax, bx):
        a.set_xlabel("RL step")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    path = Path(out_dir) / "eval.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def sample_grid(
    images: Sequence[np.ndarray], captions: Sequence[str], path: str | Path, *, cols: int = 4, scale: int = 4
) -> Path:
    """A PNG grid of uint8 HWC images, each upscaled ``scale`` x with its caption underneath."""
    from PIL import Image, ImageDraw

    if len(images) != len(captions):
        raise ValueError(f"{len(images)} images but {len(captions)} captions")
    h, w = images[0].shape[:2]
    cw, ch = w * scale, h * scale
    text_h = 34
    cell_w = max(cw, 180)
    rows = -(-len(images) // cols)
    canvas = Image.new("RGB", (cols * cell_w, rows * (ch + text_h)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (img, cap) in enumerate(zip(images, captions)):
        r, c = divmod(i, cols)
        x0, y0 = c * cell_w, r * (ch + text_h)
        tile = Image.fromarray(np.ascontiguousarray(img[..., :3])).resize((cw, ch), Image.NEAREST)
        canvas.paste(tile, (x0 + (cell_w - cw) // 2, y0))
        words, lines, cur = cap.split(), [], ""
        for wd in words:
            if len(cur) + len(wd) + 1 > 30:
                lines.append(cur)
                cur = wd
            else:
                cur = f"{cur} {wd}".strip()
        lines.append(cur)
        draw.multiline_text((x0 + 3, y0 + ch + 1), "\n".join(lines[:3]), fill="black", spacing=0)
    path = Path(path)
    canvas.save(path)
    return path
