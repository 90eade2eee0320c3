"""Held-out evaluation rows of run directories, one line per run: stage -> accuracy / reward / pass@k.

    python scripts/eval_curves.py RUN_DIR [RUN_DIR ...]

For sweeps: each run's `eval` rows in order (init, sft, rl@N every `eval.every` steps, rl), with
the RL phase's wall time. Reads only metrics.jsonl.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def curve(run: Path) -> str:
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    evals = [r for r in rows if r["phase"] == "eval"]
    cells = [
        f"{100 * r['eval_accuracy']:.1f}/{r['eval_reward']:.3f}/{100 * r.get('eval_pass_at_k', float('nan')):.0f}"
        for r in evals
    ]
    rl = [r for r in rows if r["phase"] == "rl"]
    t = f" rl {rl[-1]['time'] - rl[0]['time']:.0f}s" if len(rl) > 1 else ""
    return f"{run.name}: " + " ".join(cells) + t


if __name__ == "__main__":
    for d in sys.argv[1:]:
        try:
            print(curve(Path(d)), flush=True)
        except (OSError, KeyError, json.JSONDecodeError) as e:
            print(f"{Path(d).name}: no metrics ({e})")
