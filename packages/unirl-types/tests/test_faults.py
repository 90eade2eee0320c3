"""Fault points: trace every point passed, SIGKILL at the chosen one, and (``kill_together``) take
the process that started the killed one down with it, as a Ray driver with its workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from unirl.types.faults import ACTION_ENV, FAULT_ENV, KILL_ALSO_ENV, ONCE_ENV, SCOPE_ENV, TRACE_ENV

CHILD = (
    "from unirl.types.faults import fault_point; fault_point('sft', 0); fault_point('sft', 1); print('past')"
)
# the "driver": marks itself to die with the processes it starts (if asked to), starts one that
# reaches the kill point, and reports whether it lived on after it
DRIVER = f"""
import subprocess, sys
from unirl.types.faults import kill_together
if sys.argv[1] == "together":
    kill_together()
subprocess.run([sys.executable, "-c", {CHILD!r}])
print("driver lived on")
"""


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (FAULT_ENV, TRACE_ENV, KILL_ALSO_ENV, ONCE_ENV, SCOPE_ENV, ACTION_ENV)
    }
    return env | extra


def test_trace_lists_points_and_the_kill_is_a_sigkill_at_the_named_one(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    ok = subprocess.run(
        [sys.executable, "-c", CHILD], env=_env(**{TRACE_ENV: str(trace)}), capture_output=True
    )
    assert ok.returncode == 0 and b"past" in ok.stdout
    assert trace.read_text().split() == ["sft:0", "sft:1"]
    env = _env(**{FAULT_ENV: "sft:1", TRACE_ENV: str(tmp_path / "cut")})
    cut = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True)
    assert cut.returncode == -signal.SIGKILL and b"past" not in cut.stdout
    assert (tmp_path / "cut").read_text().split() == ["sft:0", "sft:1"]  # traced, then killed


def test_kill_together_takes_the_starting_process_down(tmp_path: Path) -> None:
    env = _env(**{FAULT_ENV: "sft:1"})
    alone = subprocess.run([sys.executable, "-c", DRIVER, "alone"], env=env, capture_output=True)
    assert alone.returncode == 0 and b"driver lived on" in alone.stdout  # only the child died
    together = subprocess.run([sys.executable, "-c", DRIVER, "together"], env=env, capture_output=True)
    assert together.returncode == -signal.SIGKILL and b"driver lived on" not in together.stdout


def test_kill_together_is_a_no_op_without_a_kill_point() -> None:
    code = "import os; from unirl.types.faults import kill_together; kill_together(); print(os.environ.get('UNIRL_TEST_KILL_ALSO'))"
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
    assert out.stdout.strip() == "None"


def test_scope_process_kills_only_the_process_at_the_point(tmp_path: Path) -> None:
    env = _env(**{FAULT_ENV: "sft:1", SCOPE_ENV: "process"})
    run = subprocess.run([sys.executable, "-c", DRIVER, "together"], env=env, capture_output=True)
    assert run.returncode == 0 and b"driver lived on" in run.stdout  # the child died, the driver did not


def test_kill_once_fires_in_the_first_process_only(tmp_path: Path) -> None:
    env = _env(**{FAULT_ENV: "sft:1", ONCE_ENV: str(tmp_path / "fired")})
    first = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True)
    assert first.returncode == -signal.SIGKILL and (tmp_path / "fired").exists()
    again = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True)
    assert again.returncode == 0 and b"past" in again.stdout  # a restarted process passes the point


def test_hang_stops_the_process_at_the_point_alive_and_silent() -> None:
    env = _env(**{FAULT_ENV: "sft:1", ACTION_ENV: "hang"})
    proc = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while _state(proc.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(proc.pid) == "T" and proc.poll() is None  # stopped at the point, not dead
        os.kill(proc.pid, signal.SIGCONT)  # whoever gives up waiting may let it go on
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and b"past" in out
    finally:
        if proc.poll() is None:
            proc.kill()


def _state(pid: int) -> str:
    """The process state letter from /proc (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
