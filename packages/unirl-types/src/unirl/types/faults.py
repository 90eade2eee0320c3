"""Named fault points: where a test can kill -9 a run at a chosen place, without timing races.

A run calls ``fault_point(where, index)`` at a few places (an SFT step, a rollout, a reward, a
train step, inside a checkpoint write). Unless a test sets one of the two variables below it
does nothing but read the environment.

- ``UNIRL_TEST_KILL_AT=<where>:<index>`` SIGKILLs this process the first time that point is
  reached: a real kill -9, no ``finally``, no flush.
- ``UNIRL_TEST_FAULT_TRACE=<file>`` appends every point reached (``<where>:<index>``, one a
  line) to the file: the list of points a kill sweep draws from (``scripts/kill_sweep.py``).

Points (``index``): ``sft`` (SFT step, after its optimizer step, before it is logged),
``rollout`` (async rollout slot, in the rollout thread), ``sampled`` / ``scored`` (RL step, after
its rollout / after reward and advantages), ``train`` / ``trained`` (RL step, before / after its
train step, before it is logged), ``ckpt_write`` (global step: every file of the checkpoint
written, not yet renamed into place) and ``ckpt_swap`` (global step: the previous checkpoint
moved aside, the new one not yet in its place).

A run of several processes (the Ray layout: a driver and its train / rollout workers) dies as a
whole, as when its job is killed: the driver calls ``kill_together()`` before it starts the
workers (they inherit its environment), and a worker that reaches the kill point SIGKILLs the
driver before itself; the local Ray cluster the driver started dies with it.
``UNIRL_TEST_KILL_SCOPE=process`` turns that off: only the process that reaches the point dies
(one component of the run: a rollout or train worker), and the rest of the run must notice.
``UNIRL_TEST_KILL_ONCE=<file>`` makes the point fire once across processes (the first to reach it
creates the file, later ones -- a restarted worker passing the point again -- go on).
``UNIRL_TEST_FAULT_ACTION=hang`` stops the process at the point instead (SIGSTOP: alive, holding its
sockets, answering nothing -- a hung worker), for the caller's deadline to notice.
The Ray workers have points of their own: ``rollout_rank<r>`` (rollout worker ``r``, RL step, at
the start of its ``generate``) and ``train_rank<r>`` (train rank ``r``, optimizer steps so far,
at the start of a train step).
"""

from __future__ import annotations

import contextlib
import os
import signal

__all__ = [
    "ACTION_ENV",
    "FAULT_ENV",
    "KILL_ALSO_ENV",
    "ONCE_ENV",
    "SCOPE_ENV",
    "TRACE_ENV",
    "fault_point",
    "kill_together",
]

FAULT_ENV = "UNIRL_TEST_KILL_AT"
TRACE_ENV = "UNIRL_TEST_FAULT_TRACE"
KILL_ALSO_ENV = "UNIRL_TEST_KILL_ALSO"
"""The pid a process reaching the kill point SIGKILLs first (set by ``kill_together``)."""
ONCE_ENV = "UNIRL_TEST_KILL_ONCE"
"""A file: the kill point fires only in the process that creates it (once across restarts)."""
ACTION_ENV = "UNIRL_TEST_FAULT_ACTION"
"""``kill`` (default): SIGKILL at the point; ``hang``: SIGSTOP (the process stays, silent)."""
SCOPE_ENV = "UNIRL_TEST_KILL_SCOPE"
"""``job`` (default): a kill point takes the whole run with it; ``process``: only its own process."""


def kill_together() -> None:
    """Tests only: while ``UNIRL_TEST_KILL_AT`` is set, a process started from here on (inheriting
    the environment) that reaches the kill point kills this one with it. A no-op otherwise, and
    with ``UNIRL_TEST_KILL_SCOPE=process`` (one component dies, not the job)."""
    if os.environ.get(FAULT_ENV) and os.environ.get(SCOPE_ENV, "job") != "process":
        os.environ[KILL_ALSO_ENV] = str(os.getpid())


def fault_point(where: str, index: int) -> None:
    """Tests only: trace and / or SIGKILL this process at point ``where:index`` (see the module)."""
    trace = os.environ.get(TRACE_ENV)
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(f"{where}:{index}\n")
    if os.environ.get(FAULT_ENV) == f"{where}:{index}":
        once = os.environ.get(ONCE_ENV)
        if once:
            try:
                os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return  # fired already (in an earlier process of this run)
        if os.environ.get(ACTION_ENV, "kill") == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
            return  # continued (SIGCONT) by whoever stopped waiting
        also = os.environ.get(KILL_ALSO_ENV)
        if also and int(also) != os.getpid():
            # already gone: another worker reached the point first
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(also), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
