"""The run directory: resolved config, metrics (jsonl + TensorBoard), plots, samples, checkpoints, report."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import yaml


class RunDir:
    """Owns ``<root>/``: ``config.yaml``, ``metrics.jsonl``, ``tb/``, ``plots/``, ``samples/``,
    ``checkpoints/`` and ``report.md``. Metrics are appended and flushed per step, so a killed run
    keeps everything it logged."""

    def __init__(self, root: str | Path, config: dict[str, Any] | None = None, *, tensorboard: bool = True):
        self.root = Path(root)
        for sub in ("plots", "samples", "checkpoints"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        if config is not None:
            (self.root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        self._metrics = (self.root / "metrics.jsonl").open("a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.root / "tb"))
        self.start = time.time()

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
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(f"{phase}/{k}", v, step)

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.root / name
        path.write_text(json.dumps(obj, indent=1))
        return path

    def close(self) -> None:
        self._metrics.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows
