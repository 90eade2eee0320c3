"""The short markdown report of a run: what improved, with the plots and sample grids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unirl.apps.evalstats import is_baseline, paired_bootstrap
from unirl.apps.trainers.phases import SFTStopConfig


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


PASS_AT_K_DROP = 0.05
"""A fall of pass@k larger than this between the last two stages is called out in the report."""


def gain_lines(
    evals: dict[str, dict[str, float]], outcomes: dict[str, dict[str, list[float]]] | None
) -> list[str]:
    """The headline of a run: the last stage's per-sample accuracy against the SFT result (the stage
    before it when there is no SFT), with a paired bootstrap interval over the shared prompts, a
    warning when that interval holds 0, and what happened to pass@k and diversity."""
    stages = [k for k in evals if "accuracy" in evals[k] and not is_baseline(k)]
    if len(stages) < 2:
        return []
    first, last = stages[-2], stages[-1]
    if "sft" in stages and last != "sft":
        first = "sft"  # RL is judged against the policy it started from, not an intermediate eval
    a, b = evals[first]["accuracy"], evals[last]["accuracy"]
    head = f"**{last} vs {first}: accuracy {a:.1%} -> {b:.1%} ({(b - a) * 100:+.1f} points)"
    out = []
    if outcomes and first in outcomes and last in outcomes:
        _, lo, hi = paired_bootstrap(outcomes[first], outcomes[last])
        prompts = len(set(outcomes[first]) & set(outcomes[last]))
        samples = sum(len(v) for v in outcomes[last].values())
        head += f"; 95% interval {lo * 100:+.1f} to {hi * 100:+.1f} points ({prompts} prompts, {samples} samples, paired bootstrap over prompts)"
        out.append(head + ".**")
        if hi < 0.0:
            out.append("")
            out.append(
                f"> Warning: accuracy fell beyond the evaluation's noise: {last} made the policy worse than "
                f"{first}. Look at the loss and grad-norm plots for drift; a lower `rl.lr` or a KL to the "
                "reference (`rl.algorithm.kl_coef` with `backend.reference: frozen_copy`) bounds it."
            )
        elif lo <= 0.0 <= hi:
            out.append("")
            out.append(
                "> Warning: the gain is within the evaluation's noise (its interval includes 0): "
                "evaluate more prompts or samples (`eval.num_prompts`, `eval.samples_per_prompt`) before reading it."
            )
    else:
        out.append(head + ".**")
    pa, pb = evals[first].get("pass_at_k"), evals[last].get("pass_at_k")
    if pa is not None and pb is not None:
        line = f"pass@k {pa:.1%} -> {pb:.1%} ({(pb - pa) * 100:+.1f} points"
        if outcomes and first in outcomes and last in outcomes:
            # the same paired bootstrap over prompts, on each prompt's solved-at-least-once indicator
            _, lo, hi = paired_bootstrap(
                *({p: [max(v)] for p, v in outcomes[s].items()} for s in (first, last))
            )
            line += f"; 95% interval {lo * 100:+.1f} to {hi * 100:+.1f}"
        line += ")"
        da, db = evals[first].get("diversity"), evals[last].get("diversity")
        if da is not None and db is not None:
            line += f"; sample diversity {da:.3f} -> {db:.3f}"
        if pa - pb > PASS_AT_K_DROP:
            why = (
                f"{last} traded coverage for per-sample accuracy (fewer prompts have any solved sample: "
                "the policy narrowed)"
                if b >= a
                else f"{last} lost coverage and per-sample accuracy both"
            )
            line += f". **pass@k fell by more than {PASS_AT_K_DROP * 100:.0f} points: {why}.**"
        out += ["", line + ("" if line.endswith("**") else ".")]
    return out + baseline_lines(evals, outcomes or {}, last)


def baseline_lines(
    evals: dict[str, dict[str, float]], outcomes: dict[str, dict[str, list[float]]], last: str
) -> list[str]:
    """The last stage against each baseline evaluated beside a stage (e.g. the prompt enhancer's
    ``sft_unenhanced``: the renderer on the raw prompts), with the same paired interval."""
    out = []
    for name in (k for k in evals if is_baseline(k) and "accuracy" in evals[k]):
        a, b = evals[name]["accuracy"], evals[last]["accuracy"]
        line = f"{last} vs {name}: accuracy {a:.1%} -> {b:.1%} ({(b - a) * 100:+.1f} points"
        if name in outcomes and last in outcomes:
            _, lo, hi = paired_bootstrap(outcomes[name], outcomes[last])
            line += f"; 95% interval {lo * 100:+.1f} to {hi * 100:+.1f}"
        out += ["", line + ")."]
    return out


def async_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The async lifecycle's account from the RL rows of metrics.jsonl: staleness histogram, the
    buffer's counts, how long the trainer (and the rollout thread) waited, partial rollouts, and
    the off-policy weights."""
    rl = {r["step"]: r for r in rows if r.get("phase") == "rl" and "async/staleness" in r}
    if not rl:
        return []
    steps = [rl[k] for k in sorted(rl)]
    hist: dict[int, int] = {}
    for r in steps:
        hist[int(r["async/staleness"])] = hist.get(int(r["async/staleness"]), 0) + 1
    last = steps[-1]
    wait = sum(r.get("async/train_wait_s", 0.0) for r in steps)
    roll = sum(r.get("async/rollout_s", 0.0) for r in steps)
    wall = steps[-1]["time"] - steps[0]["time"] if len(steps) > 1 else 0.0
    out = [
        "## Async lifecycle",
        "",
        "- staleness of the trained batches (policy versions behind): "
        + ", ".join(f"{k}: {v} steps" for k, v in sorted(hist.items())),
        f"- batches produced {last['async/produced']:.0f} = trained {last['async/trained']:.0f} + dropped "
        f"{last['async/dropped']:.0f} (too stale) + still buffered {last['async/buffered']:.0f}",
        f"- the trainer waited {wait:.1f} s for rollouts over {wall:.1f} s of RL; the rollout thread sampled "
        f"{roll:.1f} s (overlap is lost where the trainer waits)",
    ]
    if any("async/rollout_wait_s" in r for r in steps):
        idle = sum(r.get("async/rollout_wait_s", 0.0) for r in steps)
        out.append(f"- the rollout thread waited {idle:.1f} s for the staleness / capacity bounds")
    partial = [r for r in steps if "async/interrupted_frac" in r]
    if partial:  # rl.buffer.partial_rollouts
        frac = sum(r["async/interrupted_frac"] for r in partial) / len(partial)
        mean = sum(r["async/versions_per_sample_mean"] for r in partial) / len(partial)
        top = max(r["async/versions_per_sample_max"] for r in partial)
        tok = [r["async/token_staleness_mean"] for r in partial if "async/token_staleness_mean" in r]
        out.append(
            f"- partial rollouts: {100 * frac:.1f}% of trained samples were continued across a weight "
            f"update; policy versions per sample {mean:.2f} on average, {top:.0f} at most"
            + (f"; mean token staleness {sum(tok) / len(tok):.3f}" if tok else "")
        )
    clipped = [r["is_weight_clipped_frac"] for r in steps if "is_weight_clipped_frac" in r]
    if clipped:
        top = max(r.get("is_weight_raw_max", 0.0) for r in steps)
        out.append(
            f"- off-policy weights: {100 * sum(clipped) / len(clipped):.2f}% of tokens/steps clipped on "
            f"average, largest raw weight {top:.3f}"
        )
    return [*out, ""]


def sft_stop_lines(rows: list[dict[str, Any]], stop: SFTStopConfig | None) -> list[str]:
    """Where SFT ended under ``sft.stop``: the probe that reached the level, or, when none did, the
    best probe before SFT ran to ``sft.steps``."""
    probes = [r for r in rows if r.get("phase") == "sft_probe"]
    if stop is None or not probes:
        return []
    key, size = f"probe_{stop.metric}", f"{stop.num_prompts} training prompts x {stop.samples_per_prompt}"
    last = probes[-1]
    if last.get(key, float("-inf")) >= stop.at_least:
        line = (
            f"SFT ended at step {last['step']}: {stop.metric} {last[key]:.3f} >= {stop.at_least} on {size} "
            f"({len(probes)} probes from step {probes[0]['step']})"
        )
    else:
        best = max(probes, key=lambda r: float(r.get(key, float("-inf"))))
        line = (
            f"SFT ran to its step limit: {stop.metric} stayed below {stop.at_least} on {size} "
            f"(best {best.get(key, float('nan')):.3f} at step {best['step']}, {len(probes)} probes)"
        )
    return ["## SFT", "", f"- {line}", ""]


def write_report(
    run_dir: str | Path,
    *,
    title: str,
    recipe: str,
    evals: dict[str, dict[str, float]],
    timings: dict[str, float],
    notes: list[str] | None = None,
    images: list[str] | None = None,
    outcomes: dict[str, dict[str, list[float]]] | None = None,
    rows: list[dict[str, Any]] | None = None,
    sft_stop: SFTStopConfig | None = None,
) -> Path:
    """``evals`` maps a stage name ("init", "sft", "rl@N", "rl") to its held-out metrics, in run
    order; ``outcomes`` (same names) holds each evaluation's per-prompt, per-sample successes for
    the gain's interval."""
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
        gain = gain_lines(evals, outcomes)
        lines += [*([""] if gain else []), *gain, ""]
    lines += sft_stop_lines(rows or [], sft_stop)
    lines += async_lines(rows or [])
    if timings:
        total = sum(timings.values())
        lines += ["## Time", ""] + [f"- {k}: {v:.1f} s" for k, v in timings.items()]
        lines += [f"- total of the phases: {total:.1f} s ({total / 60:.1f} min)", ""]
    plots = sorted((root / "plots").glob("*.png"))
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots] + [""]
    if images:
        lines += [
            "## Samples",
            "",
            "Each grid: the same held-out prompts from the same initial noise, so they compare stage by stage.",
            "",
        ]
        lines += [f"![{Path(i).stem}]({i})" for i in images] + [""]
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
