"""Run one recipe: the domain trainer in this process, or laid out on Ray workers (``layout.kind``).

Kept apart from ``trainers/base.py`` so the shared lifecycle does not import the Ray controller
that builds on it (``distributed/controller.py`` subclasses ``Trainer``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from unirl.apps.loop import StopFlag
from unirl.apps.plots import plot_eval_curve, plot_metrics
from unirl.apps.report import write_report
from unirl.apps.run_dir import RunDir, read_metrics
from unirl.apps.trainers.base import Trainer
from unirl.apps.trainers.phases import RunSettings

__all__ = ["component_failures", "run_trainer"]

log = logging.getLogger("unirl")


def component_failures() -> tuple[type[Exception], ...]:
    """Failures of a part of the run other than the driver's loop: a Ray worker died, hung or
    raised, a weight sync failed verification, the reward server refused or stayed unavailable.
    The CLI exits 3 on them with a one-line reason naming the part; ``max_restarts`` restarts."""
    from unirl.distributed.errors import RemoteCallError, RemoteTimeoutError, WeightSyncError, WorkerDiedError
    from unirl.reward.client import RewardClientError

    return (WorkerDiedError, RemoteTimeoutError, RemoteCallError, WeightSyncError, RewardClientError)


TrainerFactory = Callable[[RunSettings, RunDir], Trainer]
"""What builds the trainer of a run: the domain trainer's class, or the Ray driver over it."""


def run_with_restarts(
    factory: TrainerFactory, recipe: RunSettings, rd: RunDir, mode: str, stop: StopFlag
) -> Trainer:
    """Build the trainer and run it; on a component failure, up to ``recipe.max_restarts`` times,
    build it again and go on from the last checkpoint (``Trainer.resume``, as a rerun with the same
    ``--run-dir`` would: the steps after the checkpoint run again, their metrics rows replaced)."""
    failures = component_failures()
    for attempt in range(recipe.max_restarts + 1):
        try:
            trainer = factory(recipe, rd)
            with stop.installed():
                trainer.run_all(mode, stop)
            return trainer
        except failures as e:
            if attempt == recipe.max_restarts or mode != "train":
                raise
            log.warning(
                "a component failed (%s: %s); restarting from the last checkpoint (restart %d of %d)",
                type(e).__name__, e, attempt + 1, recipe.max_restarts,
            )  # fmt: skip
    raise AssertionError("unreachable")


def run_trainer(
    cls: type[Trainer], recipe: RunSettings, run_dir: Path, *, mode: str, recipe_name: str, title: str
) -> int:
    factory: TrainerFactory = cls
    if recipe.layout.kind == "ray":  # the same recipe on Ray workers: config decides, code does not change
        from unirl.apps.distributed.controller import DistributedRL
        from unirl.apps.distributed.layout import check_layout, ensure_ray
        from unirl.apps.distributed.workers import LayoutRecipe

        laid_out = recipe
        if not isinstance(laid_out, LayoutRecipe):  # the other recipes reject layout.kind=ray themselves
            raise TypeError(
                f"layout.kind='ray' runs the 'ar' and 'diffusion' recipes, not {type(recipe).__name__}"
            )
        check_layout(laid_out, laid_out.layout)  # before Ray starts: a bad batch split fails in a second
        ensure_ray(laid_out.layout)

        def on_ray(_: RunSettings, rd: RunDir) -> Trainer:  # the recipe is ``laid_out``
            return DistributedRL(laid_out, rd, cls, laid_out.layout)

        factory = on_ray

    rd = RunDir(run_dir, recipe.model_dump(mode="json"))
    log.info("run directory: %s", rd.root)
    stop = StopFlag()
    try:
        trainer = run_with_restarts(factory, recipe, rd, mode, stop)
        rows = read_metrics(rd.root / "metrics.jsonl")
        plot_metrics(rows, rd.plots)
        plot_eval_curve(trainer.evals, trainer.eval_steps, trainer.eval_outcomes, rd.plots)
        report = write_report(
            rd.root,
            title=title,
            recipe=recipe_name,
            evals=trainer.evals,
            outcomes=trainer.eval_outcomes,
            timings=trainer.timings,
            images=list(dict.fromkeys(trainer.grids)),  # an evaluation run again saves the same file
            notes=["stopped early by the user (checkpoint saved)"] if stop.stop else None,
            rows=rows,
            sft_stop=recipe.sft.stop if recipe.sft is not None else None,
        )
        log.info("report: %s", report)
    finally:
        rd.close()
    return 130 if stop.stop else 0
