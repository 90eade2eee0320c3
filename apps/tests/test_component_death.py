"""One component of a run dies mid-step: the run stops, naming it, within a bound; nothing is left running.

Each test starts a real ``python -m unirl.apps.cli train`` of a tiny CPU recipe (the kill-sweep
presets), kills one component while the run is in its RL phase, and checks:

- the run exits with code 3 (a component failed) and a one-line error naming the component
  (``rollout.generate: worker rank 0 died``, ``reward server at <url> unavailable``);
- it exits within ``BOUND_S`` of the kill (the kill's time: the fault trace's last write, made
  just before the SIGKILL, or the moment the test killed the server);
- no process of the run is left: every process started from the run carries a tag in its
  environment (Ray's GCS, raylet and workers inherit the driver's), and none is alive afterwards.

A worker dies by ``UNIRL_TEST_KILL_AT`` with ``UNIRL_TEST_KILL_SCOPE=process`` (only the process
reaching the point dies: ``rollout_rank<r>`` / ``train_rank<r>``, ``unirl.types.faults``); the
reward server is a ``unirl-reward serve`` process the test SIGKILLs once the run has scored an
RL step through it (``reward.remote``). With ``max_restarts`` the run instead restarts from its
last checkpoint and ends as the uninterrupted run does. The vLLM server dying mid-generation is covered at the
engine level (``packages/unirl-rollout/tests/test_vllm_engine.py``, the vLLM tier).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
TAG_ENV = "UNIRL_TEST_RUN_TAG"
BOUND_S = 30.0
"""A run notices a dead component and has exited (Ray cluster stopped) within this many seconds."""


def _presets() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kill_sweep", ROOT / "scripts" / "kill_sweep.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("kill_sweep", mod)
    spec.loader.exec_module(mod)
    return mod


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment holds ``UNIRL_TEST_RUN_TAG=<tag>`` (zombies have none)."""
    want = f"{TAG_ENV}={tag}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if want in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def leftovers(tag: str, grace_s: float = 15.0) -> list[int]:
    """The run's processes still alive ``grace_s`` after it exited (Ray stops its daemons then)."""
    deadline = time.monotonic() + grace_s
    while (left := tagged_pids(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:  # leave nothing behind for the next test, whatever this one asserts
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def start_run(recipe: str, overrides: list[str], run_dir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    full = {**os.environ, "RAY_ADDRESS": "local", "RAY_USAGE_STATS_ENABLED": "0", **env}
    return subprocess.Popen(
        [sys.executable, "-m", "unirl.apps.cli", "train", recipe, *overrides, "--run-dir", str(run_dir)],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout_s: float = 600.0) -> tuple[int, str, float]:
    out, _ = proc.communicate(timeout=timeout_s)
    return proc.returncode, out, time.time()


def _worker_killed(tmp_path: Path, point: str, preset: str = "ar_ray") -> tuple[int, str, float, list[int]]:
    recipe, overrides = _presets().PRESETS[preset]
    tag, trace = uuid.uuid4().hex, tmp_path / "trace.txt"
    env = {
        TAG_ENV: tag,
        "UNIRL_TEST_KILL_AT": point,
        "UNIRL_TEST_KILL_SCOPE": "process",
        "UNIRL_TEST_FAULT_TRACE": str(trace),
    }
    code, out, ended = finish(start_run(recipe, overrides, tmp_path / "run", env))
    lines = trace.read_text().splitlines() if trace.exists() else []
    assert point in lines, f"the run never reached {point}:\n{out[-3000:]}"
    latency = ended - trace.stat().st_mtime  # the trace's last line is the killed worker's, then SIGKILL
    return code, out, latency, leftovers(tag)


@pytest.mark.slow
def test_rollout_worker_killed_mid_step_stops_the_run_naming_it(tmp_path: Path) -> None:
    code, out, latency, left = _worker_killed(tmp_path, "rollout_rank0:2")
    assert code == 3, out[-3000:]
    assert "error: a component of the run failed: WorkerDiedError" in out, out[-3000:]
    assert "rollout.generate: worker rank 0 died" in out, out[-3000:]
    assert latency < BOUND_S, f"exited {latency:.1f} s after the kill"
    assert left == [], f"processes of the run still alive: {left}"
    print(f"rollout worker killed: exited {latency:.1f} s after the kill")


@pytest.mark.slow
def test_train_rank_killed_mid_step_stops_the_run_naming_it(tmp_path: Path) -> None:
    # rank 1 dies at the start of an RL train step (global step 5: 4 SFT + 1 RL steps done), while
    # rank 0 goes on into the step's gradient all-reduce and would wait there for it
    code, out, latency, left = _worker_killed(tmp_path, "train_rank1:5")
    assert code == 3, out[-3000:]
    assert "error: a component of the run failed: WorkerDiedError" in out, out[-3000:]
    assert "train.train_on: worker rank 1 died" in out, out[-3000:]
    assert latency < BOUND_S, f"exited {latency:.1f} s after the kill"
    assert left == [], f"processes of the run still alive: {left}"
    print(f"train rank killed: exited {latency:.1f} s after the kill")


@pytest.mark.slow
def test_hung_rollout_worker_stops_the_run_at_the_call_deadline_naming_it(tmp_path: Path) -> None:
    """A worker that hangs (SIGSTOP at its point: alive, silent) rather than dies: the driver's call
    deadline (``layout.call_timeout_s``) ends the run with an error naming the call and the worker,
    and the stopped process is not left behind."""
    recipe, overrides = _presets().PRESETS["ar_ray"]
    deadline_s = 20.0
    tag, trace = uuid.uuid4().hex, tmp_path / "trace.txt"
    env = {
        TAG_ENV: tag,
        "UNIRL_TEST_KILL_AT": "rollout_rank0:2",
        "UNIRL_TEST_KILL_SCOPE": "process",
        "UNIRL_TEST_FAULT_ACTION": "hang",
        "UNIRL_TEST_FAULT_TRACE": str(trace),
    }
    run = start_run(recipe, [*overrides, f"layout.call_timeout_s={deadline_s}"], tmp_path / "run", env)
    code, out, ended = finish(run)
    assert "rollout_rank0:2" in trace.read_text().splitlines(), out[-3000:]
    latency = ended - trace.stat().st_mtime
    assert code == 3, out[-3000:]
    assert "error: a component of the run failed: RemoteTimeoutError" in out, out[-3000:]
    assert "rollout.generate" in out, out[-3000:]
    assert deadline_s <= latency < deadline_s + BOUND_S, f"exited {latency:.1f} s after the hang"
    assert leftovers(tag) == []
    print(f"rollout worker hung: exited {latency:.1f} s after it stopped (deadline {deadline_s:.0f} s)")


@pytest.mark.slow
def test_with_max_restarts_a_dead_worker_is_replaced_and_the_run_ends_as_if_uninterrupted(
    tmp_path: Path,
) -> None:
    """``max_restarts: 1``: the rollout worker dies once at RL step 2; the run restarts from its last
    checkpoint in the same process (new workers) and ends bit-identical to the uninterrupted run."""
    ks = _presets()
    recipe, overrides = ks.PRESETS["ar_ray"]
    overrides = [*overrides, "max_restarts=1"]
    tag = uuid.uuid4().hex
    code, out, _ = finish(start_run(recipe, overrides, tmp_path / "whole", {TAG_ENV: tag}))
    assert code == 0, out[-3000:]
    env = {
        TAG_ENV: tag,
        "UNIRL_TEST_KILL_AT": "rollout_rank0:2",
        "UNIRL_TEST_KILL_SCOPE": "process",
        "UNIRL_TEST_KILL_ONCE": str(tmp_path / "fired"),
    }
    code, out, _ = finish(start_run(recipe, overrides, tmp_path / "cut", env))
    assert code == 0, out[-3000:]
    assert (tmp_path / "fired").exists(), "the worker was never killed"
    assert "restarting from the last checkpoint (restart 1 of 1)" in out, out[-3000:]
    assert ks.compare(tmp_path / "whole", tmp_path / "cut") == []
    assert leftovers(tag) == []


def _serve(tmp_path: Path, scorers: list[dict[str, object]], tag: str) -> tuple[subprocess.Popen[bytes], str]:
    cfg, port_file = tmp_path / "serve.json", tmp_path / "port"
    cfg.write_text(json.dumps({"scorers": scorers, "server": {"port": 0}}))  # JSON is YAML
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "unirl.reward.cli",
            "serve",
            "--config",
            str(cfg),
            "--port-file",
            str(port_file),
        ],
        env={**os.environ, TAG_ENV: tag},
    )
    deadline = time.monotonic() + 120
    while not (port_file.exists() and port_file.read_text().strip()):
        assert server.poll() is None, "the reward server exited at start"
        assert time.monotonic() < deadline, "the reward server did not listen within 120 s"
        time.sleep(0.1)
    return server, f"http://127.0.0.1:{int(port_file.read_text())}"


def _rewards(run_dir: Path) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["reward_mean"] for r in rows if "reward_mean" in r]


@pytest.mark.slow
def test_reward_server_scores_a_run_as_in_process_and_its_death_stops_the_run(tmp_path: Path) -> None:
    recipe, overrides = _presets().PRESETS["ar"]
    tag = uuid.uuid4().hex
    scorers: list[dict[str, object]] = [{"name": "exact", "weight": 1.0, "scorer": {"kind": "arithmetic"}}]
    server, url = _serve(tmp_path, scorers, tag)
    try:
        # the same run scored in-process and through the server: the same rewards, step for step
        local = tmp_path / "local"
        code, out, _ = finish(start_run(recipe, overrides, local, {TAG_ENV: tag}))
        assert code == 0, out[-3000:]
        remote = tmp_path / "remote"
        code, out, _ = finish(
            start_run(recipe, [*overrides, f"reward.remote.url={url}"], remote, {TAG_ENV: tag})
        )
        assert code == 0, out[-3000:]
        assert _rewards(remote) == _rewards(local) and len(_rewards(local)) == 4

        # now kill the server once the run has scored RL step 1 through it
        trace = tmp_path / "trace.txt"
        env = {TAG_ENV: tag, "UNIRL_TEST_FAULT_TRACE": str(trace)}
        proc = start_run(
            recipe, [*overrides, "rl.steps=40", f"reward.remote.url={url}"], tmp_path / "dies", env
        )
        deadline = time.monotonic() + 300
        while not (trace.exists() and "scored:1" in trace.read_text().splitlines()):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the run did not reach RL step 1 within 300 s"
            time.sleep(0.05)
        server.kill()
        killed = time.time()
        code, out, ended = finish(proc)
    finally:
        server.kill()
        server.wait()
    assert code == 3, out[-3000:]
    assert f"RewardClientError: reward server at {url} unavailable after 6 attempts" in out, out[-3000:]
    assert ended - killed < BOUND_S, f"exited {ended - killed:.1f} s after the kill"
    assert leftovers(tag) == []
    print(f"reward server killed: the run exited {ended - killed:.1f} s after the kill")
