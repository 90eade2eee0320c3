"""What a checkpoint carries for the run beside the model: the report's history, how many metrics
rows were logged, and the global Python / NumPy RNGs, as JSON (``save_checkpoint``'s ``extra``).

A resumed run goes on from its checkpoint, so its report (evaluations, timings, sample grids) starts
from what the run had there: an evaluation logged after the checkpoint is run again, and the rows
logged after it are dropped (``RunDir.truncate``) before they are logged again. Dicts are stored as
lists of pairs: the checkpoint's JSON sorts keys, and the order is the run's (stages in the report,
prompts in the bootstrap).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from unirl.apps.run_dir import RunDir

__all__ = ["RunHistory", "capture", "restore"]


class _Phase(Protocol):
    @property
    def steps(self) -> int: ...


class _Recipe(Protocol):
    @property
    def rl(self) -> _Phase | None: ...


class RunHistory(Protocol):
    """What ``capture`` / ``restore`` read and write of a trainer (``Trainer``, the Ray driver)."""

    evals: dict[str, dict[str, float]]
    eval_steps: dict[str, int]
    eval_outcomes: dict[str, dict[str, list[float]]]
    timings: dict[str, float]
    grids: list[str]
    rl_step: int
    checkpoint_rows: int | None

    @property
    def cfg(self) -> _Recipe: ...

    @property
    def run(self) -> RunDir: ...

    @property
    def rl_started(self) -> float | None: ...


def capture(trainer: RunHistory) -> dict[str, Any]:
    """The run state of ``trainer`` (a ``Trainer``) now, JSON-safe."""
    timings = dict(trainer.timings)
    if trainer.rl_started is not None:  # mid-RL: its time so far (rl() adds the phase's when it ends)
        timings["rl"] = timings.get("rl", 0.0) + time.time() - trainer.rl_started
    evals = [
        {
            "name": name,
            "step": trainer.eval_steps.get(name, 0),
            "metrics": list(m.items()),
            "outcomes": list(trainer.eval_outcomes.get(name, {}).items()),
        }
        for name, m in trainer.evals.items()
    ]
    return {
        "metrics_rows": trainer.run.rows,
        "report": {"evals": evals, "timings": list(timings.items()), "grids": list(trainer.grids)},
        "rng": rng_state(),
    }


def restore(trainer: RunHistory, extra: dict[str, Any]) -> None:
    """Inverse of ``capture`` (after the data cursor is restored); a checkpoint that has none of
    it (written before it was saved) leaves the trainer's fresh state and the metrics as they are."""
    rows = extra.get("metrics_rows")
    trainer.checkpoint_rows = None if rows is None else int(rows)
    if "rng" in extra:
        set_rng_state(extra["rng"])
    report = extra.get("report")
    if report is None:
        return
    for e in report["evals"]:
        trainer.evals[e["name"]] = dict(e["metrics"])
        trainer.eval_steps[e["name"]] = int(e["step"])
        trainer.eval_outcomes[e["name"]] = {str(p): list(v) for p, v in e["outcomes"]}
    trainer.timings.update({str(k): float(v) for k, v in report["timings"]})
    trainer.grids.extend(str(g) for g in report["grids"])
    rl = trainer.cfg.rl
    if "rl" in trainer.evals and rl is not None and trainer.rl_step < rl.steps:
        _rename_eval(trainer, "rl", f"rl@{trainer.eval_steps['rl']}")


def _rename_eval(trainer: RunHistory, old: str, new: str) -> None:
    """The final evaluation of a run stopped early (Ctrl-C) or extended (more `rl.steps`) is an
    intermediate one of the run that goes on: named by its step, so the final one does not replace
    it, and its grid file moved aside so the final grid does not overwrite it."""
    trainer.evals = {new if k == old else k: v for k, v in trainer.evals.items()}
    trainer.eval_steps[new] = trainer.eval_steps.pop(old)
    if old in trainer.eval_outcomes:
        trainer.eval_outcomes[new] = trainer.eval_outcomes.pop(old)
    root = trainer.run.root
    for i, g in enumerate(trainer.grids):
        path = Path(g)
        if path.stem == old and (root / path).is_file():
            moved = path.with_name(f"{new}{path.suffix}")
            (root / path).replace(root / moved)
            trainer.grids[i] = str(moved)


def rng_state() -> dict[str, Any]:
    """The global Python and NumPy RNG states as JSON-safe data (torch's is in the checkpoint)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, state, gauss_next = random.getstate()
    return {
        "python": {"version": version, "state": list(state), "gauss_next": gauss_next},
        "numpy": {
            "kind": str(kind),
            "keys": np.asarray(keys).tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of ``rng_state``."""
    p, n = state["python"], state["numpy"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    keys = np.asarray(n["keys"], dtype=np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
