"""Plots (PNG) from metrics.jsonl, and sample grids with prompts and rewards."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# (file name, title, metric keys that may appear, phases to draw)
PANELS: list[tuple[str, str, tuple[str, ...]]] = [
    ("reward.png", "reward (train batches)", ("reward_mean",)),
    ("eval.png", "held-out accuracy / reward", ("eval_accuracy", "eval_reward")),
    ("loss.png", "loss", ("loss",)),
    ("kl.png", "KL to the rollout policy", ("approx_kl", "kl")),
    ("clip.png", "clip fraction", ("clip_frac",)),
]


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
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=label)
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
