"""The short markdown report of a run: what improved, with the plots and sample grids."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def write_report(
    run_dir: str | Path,
    *,
    title: str,
    recipe: str,
    evals: dict[str, dict[str, float]],
    timings: dict[str, float],
    notes: list[str] | None = None,
    images: list[str] | None = None,
) -> Path:
    """``evals`` maps a stage name ("base", "sft", "rl") to its held-out metrics, in run order."""
    root = Path(run_dir)
    lines = [f"# {title}", "", f"Recipe: `{recipe}`", ""]
    if evals:
        keys = sorted({k for m in evals.values() for k in m})
        lines += [
            "## Held-out evaluation",
            "",
            "| stage | " + " | ".join(keys) + " |",
            "|---" * (len(keys) + 1) + "|",
        ]
        for stage, m in evals.items():
            lines.append(f"| {stage} | " + " | ".join(_fmt(m.get(k)) for k in keys) + " |")
        stages = list(evals)
        if len(stages) >= 2 and "accuracy" in evals[stages[-1]] and "accuracy" in evals[stages[-2]]:
            a, b = evals[stages[-2]]["accuracy"], evals[stages[-1]]["accuracy"]
            lines += [
                "",
                f"**{stages[-1]} vs {stages[-2]}: accuracy {a:.1%} -> {b:.1%} ({(b - a) * 100:+.1f} points).**",
            ]
        lines.append("")
    if timings:
        lines += ["## Time", ""] + [f"- {k}: {v:.1f} s" for k, v in timings.items()] + [""]
    plots = sorted((root / "plots").glob("*.png"))
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots] + [""]
    if images:
        lines += ["## Samples", ""] + [f"![{Path(i).stem}]({i})" for i in images] + [""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    lines += [
        "Metrics: `metrics.jsonl` (and TensorBoard: `tensorboard --logdir tb`). Config: `config.yaml`.",
        "",
    ]
    path = root / "report.md"
    path.write_text("\n".join(lines))
    return path


def summarize(evals: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{k}: " + " ".join(f"{m}={_fmt(v)}" for m, v in d.items()) for k, d in evals.items())
