"""Live progress (phase, step, key metrics, ETA) on a terminal; plain log lines elsewhere."""

from __future__ import annotations

import logging
import sys
from types import TracebackType

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

log = logging.getLogger("unirl")


def setup_logging(level: int = logging.INFO) -> Console:
    """Rich log lines on a terminal; plain one-line records (greppable, never wrapped) elsewhere."""
    console = Console(stderr=True)
    handler: logging.Handler
    if console.is_terminal:
        handler = RichHandler(console=console, show_path=False, rich_tracebacks=False)
        handler.setFormatter(logging.Formatter("%(message)s", datefmt="%H:%M:%S"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    for noisy in ("httpx", "urllib3", "PIL", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return console


class PhaseProgress:
    """``with PhaseProgress("rl", total) as p: p.advance(reward=0.4, loss=0.1)``."""

    def __init__(self, phase: str, total: int, console: Console | None = None):
        self.phase, self.total = phase, total
        self.console = console or Console(stderr=True)
        self._live = self.console.is_terminal and sys.stderr.isatty()
        self._progress: Progress | None = None
        self._task = None
        self._step = 0

    def __enter__(self) -> PhaseProgress:
        if self._live:
            self._progress = Progress(
                TextColumn("[bold]{task.fields[phase]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(self.phase, total=self.total, phase=self.phase, stats="")
        return self

    def advance(self, **stats: float) -> None:
        self._step += 1
        text = "  ".join(f"{k}={v:.3g}" for k, v in stats.items())
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, stats=text)
        else:
            log.info("%s %d/%d %s", self.phase, self._step, self.total, text)

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.__exit__(t, e, tb)
