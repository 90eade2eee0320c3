"""One line per run directory: the RL phase's wall time per trained Sample, the async lifecycle's
staleness and waits, and held-out accuracy after SFT and at the end (docs/benchmarks.md, "Async").

    python scripts/async_summary.py RUN_DIR [RUN_DIR ...]

Ratios (`vs`) are against the first run given, measured in the same invocation of the sweep.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import yaml


def last_process(rl_rows: list[dict]) -> list[dict]:
    """The RL rows the last process wrote, one per step. A resumed run's metrics.jsonl holds the
    killed process's rows first; each process's `time` counts from its own start, so a row whose
    time is below its predecessor's begins a new process (mixing the two made wall time negative)."""
    start = max((i for i in range(1, len(rl_rows)) if rl_rows[i]["time"] < rl_rows[i - 1]["time"]), default=0)
    by_step = {r["step"]: r for r in rl_rows[start:]}  # the last row of a step
    return [by_step[k] for k in sorted(by_step)]


def summary(run: Path) -> dict[str, float | str]:
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    steps = last_process([r for r in rows if r["phase"] == "rl"])
    evals = [r for r in rows if r["phase"] == "eval"]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    per_step = cfg["rl"]["prompts_per_step"] * cfg["rl"]["samples_per_prompt"]
    # wall time from the end of the first step to the end of the last (of the last process): steady
    # state, no start-up
    wall = steps[-1]["time"] - steps[0]["time"]
    hist = Counter(int(r.get("async/staleness", 0)) for r in steps)
    return {
        "run": run.name,
        "rl_steps": len(steps),
        "s_per_sample": wall / max(1, (len(steps) - 1) * per_step),
        "staleness": " ".join(f"{k}:{v}" for k, v in sorted(hist.items())),
        "train_wait_s": sum(r.get("async/train_wait_s", 0.0) for r in steps),
        "rollout_s": sum(r.get("async/rollout_s", 0.0) for r in steps),
        "rollout_wait_s": sum(r.get("async/rollout_wait_s", 0.0) for r in steps),
        "interrupted": sum(r.get("async/interrupted_frac", 0.0) for r in steps) / len(steps),
        "dropped": steps[-1].get("async/dropped", 0.0),
        "sft_acc": next(
            (e["eval_accuracy"] for e in evals if e["step"] == 0 and e is not evals[0]), float("nan")
        ),
        "final_acc": evals[-1]["eval_accuracy"] if evals else float("nan"),
    }


if __name__ == "__main__":
    base = None
    for d in sys.argv[1:]:
        try:
            s = summary(Path(d))
        except (OSError, KeyError, IndexError, ValueError) as e:
            print(f"{Path(d).name}: unreadable ({e!r})")
            continue
        base = base or s["s_per_sample"]
        print(
            f"{s['run']}: {s['rl_steps']} steps, {1e3 * s['s_per_sample']:.2f} ms/sample "  # type: ignore[operator]
            f"(vs first: {base / s['s_per_sample']:.2f}x faster), staleness {s['staleness']}, "  # type: ignore[operator]
            f"train waited {s['train_wait_s']:.1f}s, rollout {s['rollout_s']:.1f}s (waited "
            f"{s['rollout_wait_s']:.1f}s), interrupted {100 * s['interrupted']:.1f}%, dropped {s['dropped']:.0f}, "  # type: ignore[operator]
            f"acc sft {100 * s['sft_acc']:.1f}% -> {100 * s['final_acc']:.1f}%"  # type: ignore[operator]
        )
