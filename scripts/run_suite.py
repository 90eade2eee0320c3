"""The whole test suite (what `./dev test` and CI run): nox sessions in parallel streams.

    python scripts/run_suite.py [--streams N] [--sessions-of STREAM] [pytest args after --]

Why streams: on a 2-core machine one serial nox run keeps the cores busy ~40% of the time (Ray
and vLLM start-ups, subprocess tests and sockets wait), so two independent streams finish in
less wall time. Each stream is its own `nox` process over its own sessions (each session has
its own environment under .nox/) with its own Ray temp dir, and writes a log under
.nox/logs/; what fails is printed in full at the end. The last line is the plain
`N passed, N failed` total of every pytest run (CI reads it), then per-session times.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Two streams on a 2-core machine (measured: docs/benchmarks.md, "Suite time"): the quick checks,
# package tiers and the apps tier's learning runs beside the rest of the apps tier, then the vLLM tier. The vLLM tier beside the apps tier
# instead slowed both ~2x (their torch threads contend: 11.4 min against 8.9 for this split).
STREAMS: list[list[str]] = [
    [
        "lint",
        "typecheck",
        "layers",
        "schema",
        "tests(package='types')",
        "tests(package='reward')",
        "tests(package='distributed')",
        "tests(package='train')",
        "tests(package='rollout')",
        "tests_apps_e2e",
    ],
    ["tests(package='apps')", "tests_vllm"],
]
SUMMARY = re.compile(r"^=*\s*(?P<body>(\d+ \w+(, )?)+)( in [\d.]+s.*)?=*$")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")
SESSION_TIME = re.compile(r"nox > \* (?P<name>.+?): (?P<status>\w+)(, took (?P<took>.+))?$")


def parse_counts(log: str) -> dict[str, int]:
    """Summed pytest totals of every summary line in a nox log."""
    totals: dict[str, int] = {}
    for line in log.splitlines():
        line = line.strip()
        if not SUMMARY.match(line) or " in " not in line:
            continue
        for n, what in COUNT.findall(line):
            key = "errors" if what.startswith("error") else what
            totals[key] = totals.get(key, 0) + int(n)
    return totals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=int(os.environ.get("UNIRL_TEST_STREAMS", "2")))
    ap.add_argument(
        "--deadline-min",
        type=float,
        default=float(os.environ.get("UNIRL_SUITE_DEADLINE_MIN", "60")),
        help="kill every stream still running after this many minutes and print where each stood "
        "(CI allows 90; a hang must report itself, not eat the whole allowance)",
    )
    ap.add_argument("pytest_args", nargs="*", help="passed to every pytest run (after --)")
    args = ap.parse_args()
    sessions = [s for stream in STREAMS for s in stream]
    n = max(1, min(args.streams, len(STREAMS)))
    streams = STREAMS if n == len(STREAMS) else [sessions]
    logs = ROOT / ".nox" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    nox = str(Path(sys.executable).with_name("nox"))
    procs = []
    t0 = time.time()
    for i, stream in enumerate(streams):
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env = dict(os.environ, UNIRL_RAY_TMPDIR=f"/tmp/unirl-ray{i}", PATH=path)
        if len(streams) > 1:
            # OpenMP threads that spin while they wait steal the other stream's cores: a 2-thread
            # training run beside another took 47.8 s instead of 22.6 s with passive waiting
            # (docs/benchmarks.md, "Suite time"); alone, passive costs ~10%
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        log = (logs / f"stream{i}.log").open("w")
        cmd = [nox, "--no-color", "-s", *stream]
        if args.pytest_args:
            cmd += ["--", *args.pytest_args]
        print(f"[suite] stream {i}: {' '.join(stream)} -> {log.name}", flush=True)
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        procs.append((proc, log, i))
    codes = []
    for p, log, i in procs:
        left = args.deadline_min * 60 - (time.time() - t0)
        try:
            codes.append(p.wait(timeout=max(left, 1.0)))
        except subprocess.TimeoutExpired:
            # The whole process group: nox, pytest, its Ray workers, spawned ranks and servers.
            os.killpg(p.pid, signal.SIGKILL)
            codes.append(p.wait())
            print(f"[suite] stream {i} passed the {args.deadline_min:.0f} min deadline: killed", flush=True)
            with Path(log.name).open("a") as f:
                f.write(
                    f"\n[suite] KILLED at the {args.deadline_min:.0f} min deadline; the last test named "
                    "above is where it stood (faulthandler_timeout dumps stacks of a test over 15 min)\n"
                )
        log.close()
        print(f"[suite] stream {i} exited {codes[-1]} after {time.time() - t0:.0f} s", flush=True)
    totals: dict[str, int] = {}
    times: list[str] = []
    for _, log, i in procs:
        text = Path(log.name).read_text()
        for k, v in parse_counts(text).items():
            totals[k] = totals.get(k, 0) + v
        for line in text.splitlines():
            m = SESSION_TIME.search(line)
            if m:
                times.append(f"  {m['name']}: {m['status']}" + (f", {m['took']}" if m["took"] else ""))
        if codes[i] != 0:
            print(f"\n[suite] ===== stream {i} failed: its log ({log.name}) =====", flush=True)
            print(text[-20000:], flush=True)
    wall = time.time() - t0
    print(f"\n[suite] sessions (wall {wall / 60:.1f} min for the whole suite, {len(streams)} streams):")
    print("\n".join(times))
    failed = totals.get("failed", 0) + totals.get("errors", 0)
    ok = all(c == 0 for c in codes)
    if not ok and failed == 0:
        failed = 1  # a session failed outside pytest (lint, install): count it
    line = f"{totals.get('passed', 0)} passed, {failed} failed"
    if totals.get("skipped"):
        line += f", {totals['skipped']} skipped"
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
