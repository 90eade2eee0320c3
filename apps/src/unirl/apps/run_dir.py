"""The run directory: resolved config, metrics (jsonl + TensorBoard), plots, samples, checkpoints, report."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

REBUILT_EVENTS = "events.out.tfevents.0000000000.rebuilt"
"""The events file a resume rebuilds TensorBoard's kept rows into (it sorts before every writer's)."""


class RunDir:
    """Owns ``<root>/``: ``config.yaml``, ``metrics.jsonl``, ``tb/``, ``plots/``, ``samples/``,
    ``checkpoints/`` and ``report.md``. Metrics are appended and flushed per step, so a killed run
    keeps everything it logged; a resumed one first drops what it logged after its checkpoint
    (``truncate``), as it logs those steps again."""

    def __init__(self, root: str | Path, config: dict[str, Any] | None = None, *, tensorboard: bool = True):
        self.root = Path(root)
        for sub in ("plots", "samples", "checkpoints"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        if config is not None:
            (self.root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        path = self.metrics_path
        self.rows = len(_complete_lines(path.read_text())) if path.is_file() else 0
        """Rows in metrics.jsonl (a checkpoint records it: what a resumed run keeps)."""
        self._metrics = self.metrics_path.open("a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.root / "tb"))
        self.start = time.time()

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def samples(self) -> Path:
        return self.root / "samples"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    def log(self, step: int, metrics: dict[str, float], *, phase: str) -> None:
        """Append one row (``phase`` e.g. "sft", "rl", "eval") to metrics.jsonl and TensorBoard."""
        clean = {
            k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(float(v))
        }
        row = {"phase": phase, "step": step, "time": round(time.time() - self.start, 3), **clean}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        self.rows += 1
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(f"{phase}/{k}", v, step)

    def truncate(self, rows: int) -> int:
        """Keep only the first ``rows`` rows of metrics.jsonl, and TensorBoard's events of just those
        (rebuilt from them); returns how many rows were dropped.

        A run resumed from a checkpoint logged at row ``rows`` logs again every step and evaluation
        it runs after it: without this they would count twice. The file is replaced atomically.
        TensorBoard's own ``purge_step`` cannot do it: it hides every tag's events from one step on,
        while SFT, RL and evaluation rows each count their own steps."""
        text = self.metrics_path.read_text() if self.metrics_path.is_file() else ""
        lines = _complete_lines(text)
        kept = "".join(lines[:rows])
        dropped = len(lines) - min(rows, len(lines))
        if kept != text:  # rows to drop, or the tail of a row a kill cut short
            self._metrics.close()
            tmp = self.metrics_path.with_name("metrics.jsonl.tmp")
            tmp.write_text(kept)
            os.replace(tmp, self.metrics_path)
            self._metrics = self.metrics_path.open("a")
        self.rows = len(lines) - dropped
        if dropped and self._tb is not None:
            self._rebuild_tensorboard([json.loads(x) for x in lines[:rows]])
        return dropped

    def _rebuild_tensorboard(self, rows: list[dict[str, Any]]) -> None:
        """tb/ written afresh from ``rows`` (one event per row), swapped in for the old one."""
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.writer import FileWriter

        assert self._tb is not None
        self._tb.close()
        tb, fresh, old = self.root / "tb", self.root / "tb.rebuilt", self.root / "tb.old"
        shutil.rmtree(fresh, ignore_errors=True)
        writer = FileWriter(str(fresh))
        for r in rows:
            values = [
                Summary.Value(tag=f"{r['phase']}/{k}", simple_value=v)
                for k, v in r.items()
                if k not in ("phase", "step", "time") and isinstance(v, int | float)
            ]
            writer.add_summary(Summary(value=values), r["step"])
        writer.close()
        # TensorBoard reads a folder's event files in name order, and a writer's name ends in a
        # process-wide counter that is not zero-padded (".9" sorts after ".10"): name the rebuilt
        # file so it sorts before any the writer below opens.
        (written,) = fresh.glob("events.out.tfevents.*")
        written.rename(fresh / REBUILT_EVENTS)
        shutil.rmtree(old, ignore_errors=True)
        if tb.exists():
            os.replace(tb, old)
        os.replace(fresh, tb)
        shutil.rmtree(old, ignore_errors=True)
        self._tb = SummaryWriter(str(tb))

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.root / name
        path.write_text(json.dumps(obj, indent=1))
        return path

    def close(self) -> None:
        self._metrics.close()
        if self._tb is not None:
            self._tb.close()


def _complete_lines(text: str) -> list[str]:
    """The non-empty, newline-terminated lines of ``text`` (a row cut short by a kill is not one)."""
    return [x for x in text.splitlines(keepends=True) if x.endswith("\n") and x.strip()]


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows
