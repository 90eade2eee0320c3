"""The figures of docs/reliability.md (issue 23): each from a real measurement, its JSON beside it.

    .venv/bin/python scripts/reliability_figures.py kill-sweep docs/figures/kill_sweep_*.json  # §8, §8b
    .venv/bin/python scripts/reliability_figures.py weightsync [--broadcast]                  # §2
    .venv/bin/python scripts/reliability_figures.py component-death                           # §9 (~5 min)
    .venv/bin/python scripts/reliability_figures.py mutations                                 # §1
    .venv/bin/python scripts/reliability_figures.py checkpoint-faults | source-scan          # §3, §4
    .venv/bin/python scripts/reliability_figures.py server-bad-input | server-security       # §6, §7

(the last four live in scripts/reliability_figures_server.py, registered below)

``kill-sweep`` reads what ``scripts/kill_sweep.py --json OUT`` wrote (one file per preset) and
draws points survived / tried per kind of fault point. The other three run the pytest files the
sections name, in this process, with a plugin that records each test's outcome and captured
output: a test there passes only when its fault was caught and nothing bad was loaded / built,
so "detected" is "passed", counted per fault kind from the test's name and parameters. Nothing
here re-implements a check. Each subcommand writes ``docs/figures/<name>.png`` and ``<name>.json``;
``--replot`` redraws a figure from that JSON without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"
PHASES = {  # kind of fault point (unirl.types.faults) -> what the run was doing
    "sft": "SFT step",
    "rollout": "async rollout",
    "sampled": "after rollout",
    "scored": "after reward",
    "train": "before train step",
    "trained": "after train step",
    "ckpt_write": "ckpt files written",
    "ckpt_swap": "ckpt old moved aside",
    "rollout_rank": "rollout worker generate",
    "train_rank": "train rank step",
}
WEIGHTSYNC_TESTS = [
    "packages/unirl-distributed/tests/test_weightsync_corruption.py",
    "apps/tests/test_async_mailbox_corruption.py",
]
BROADCAST_TEST = "packages/unirl-distributed/tests/test_weightsync_broadcast_faults.py"
SYNC_FAULTS = [  # (fragment of the test's name, fault), first match wins
    ("control", "control (no fault)"),
    ("flipped_bit", "one bit flipped"),
    ("dropped_from_ticket", "bucket dropped from ticket"),
    ("lost_in_transit", "payload lost"),
    ("missing_a_tensor", "payload lost"),
    ("stale_or_repeated", "stale / repeated version"),
    ("does_not_increase", "stale / repeated version"),
    ("another_dtype", "other dtype"),
]
TRANSPORTS = ["tensor_buckets", "shared_memory", "async_mailbox", "broadcast"]
DEATH_TEST = "apps/tests/test_component_death.py"
DEATH_K = "killed_mid_step or hung or reward_server"
DEATHS = {  # what the test prints -> (component, bound in s after the fault, fragment of its name)
    "rollout worker killed": ("rollout worker\n(SIGKILL)", 30.0, "rollout_worker_killed"),
    "train rank killed": ("train rank 1\n(SIGKILL)", 30.0, "train_rank_killed"),
    "reward server killed": ("reward server\n(SIGKILL)", 30.0, "reward_server"),
    "rollout worker hung": ("rollout worker hung\n(SIGSTOP, deadline 20 s)", 20.0 + 30.0, "hung_rollout"),
}
MUTATION_TEST = "apps/tests/test_recipe_mutations.py"


# ---- pure parts (apps/tests/test_reliability_figures.py) ------------------------------------


def phase_of(point: str) -> str:
    """``train_rank1:5`` -> ``train rank step``; ``ckpt_write:7`` -> ``ckpt files written``."""
    kind = re.sub(r"\d+$", "", point.rsplit(":", 1)[0])
    return PHASES.get(kind, kind)


def aggregate_kills(sweeps: list[dict[str, Any]]) -> dict[str, dict[str, list[int]]]:
    """``{label: {phase: [survived, tried]}}`` over kill_sweep.py JSONs (one label per preset)."""
    out: dict[str, dict[str, list[int]]] = {}
    for s in sweeps:
        label = f"{s['preset']} ({s['launcher']})"
        per = out.setdefault(label, {})
        for o in s["outcomes"]:
            cell = per.setdefault(phase_of(o["point"]), [0, 0])
            cell[0] += bool(o["ok"])
            cell[1] += 1
    return out


def sync_case(nodeid: str) -> tuple[str, str] | None:
    """(fault, transport) a weight-sync test node sweeps, or None for a test outside the sweep."""
    name, _, params = nodeid.partition("::")[2].partition("[")
    fault = next((f for frag, f in SYNC_FAULTS if frag in name), None)
    if fault is None:
        return None
    if "mailbox" in nodeid:
        return fault, "async_mailbox"
    if "broadcast" in nodeid:
        return fault, "broadcast"
    return fault, next((t for t in TRANSPORTS if t in params), "?")


def mutation_case(nodeid: str) -> str | None:
    """The category of a recipe-mutation test node (``control`` for an unmutated recipe)."""
    name, _, params = nodeid.partition("::")[2].partition("[")
    if name == "test_unmutated_recipe_reaches_the_build":
        return "control (unmutated)"
    if name == "test_mutation_rejected_before_any_model":
        return params.split(":", 1)[0]
    return None


def death_latencies(stdout: str) -> dict[str, float]:
    """``{what: seconds}`` from the lines test_component_death.py prints with each measurement."""
    found = re.findall(r"^(.+?): (?:the run )?exited ([0-9.]+) s after", stdout, re.M)
    return {what: float(s) for what, s in found}


def death_rows(records: list[dict[str, Any]]) -> list[tuple[str, float | None, float, str]]:
    """(component, seconds to exit or None where the test failed before printing, bound, outcome)
    for each component-death test that ran, in DEATHS order."""
    rows = []
    for what, (label, bound, frag) in DEATHS.items():
        for r in records:
            if frag in r["nodeid"]:
                seconds = death_latencies(r.get("stdout", "")).get(what)
                rows.append((label, seconds, bound, r["outcome"]))
    return rows


def tally(records: list[dict[str, Any]], case: Any) -> dict[str, dict[str, list[int]]]:
    """``{group: {column: [passed, tried]}}``; ``case(nodeid)`` gives (group, column), a str or None."""
    out: dict[str, dict[str, list[int]]] = defaultdict(dict)
    for r in records:
        c = case(r["nodeid"])
        if c is None:
            continue
        group, col = (c, "") if isinstance(c, str) else c
        cell = out[group].setdefault(col, [0, 0])
        cell[0] += r["outcome"] == "passed"
        cell[1] += 1
    return dict(out)


# ---- running the measurements ----------------------------------------------------------------


@dataclass
class Machine:
    cpus: int | None
    cpu: str
    load_before: float
    load_after: float = 0.0
    wall_s: float = 0.0


def machine() -> Machine:
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return Machine(os.cpu_count(), model.group(1) if model else "?", os.getloadavg()[0])


class Recorder:
    """A pytest plugin: each test's outcome, duration and captured stdout."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        last = self.records[-1] if self.records else {}
        if report.when == "teardown" and report.capstdout and last.get("nodeid") == report.nodeid:
            last["stdout"] = report.capstdout  # all phases' output: a module fixture's teardown print
        elif report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.records.append(
                {
                    "nodeid": report.nodeid,
                    "outcome": report.outcome,
                    "seconds": round(report.duration, 2),
                }
                | ({"stdout": report.capstdout} if report.capstdout else {})
            )


def run_tests(args: list[str], replot: Path | None = None) -> tuple[list[dict[str, Any]], Machine]:
    """Run pytest ``args`` here with a Recorder; with ``replot``, the records a run saved there."""
    if replot is not None:
        saved = json.loads(replot.read_text())
        return saved["tests"], Machine(**saved["machine"])
    import pytest

    m, t0, rec = machine(), time.time(), Recorder()
    os.chdir(ROOT)
    pytest.main(["-q", "-p", "no:cacheprovider", *args], plugins=[rec])
    m.wall_s, m.load_after = round(time.time() - t0, 1), os.getloadavg()[0]
    return rec.records, m


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, name: str, res: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_dir / f"{name}.png", dpi=110)
    (out_dir / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out_dir / name}.png and .json")


def where(m: Machine | dict[str, Any]) -> str:
    d = asdict(m) if isinstance(m, Machine) else m
    return (
        f"{d['cpus']} CPUs ({d['cpu']}), load {d['load_before']:.1f} -> {d['load_after']:.1f}, "
        f"{d['wall_s']:.0f} s"
    )


def bars(ax: Any, groups: dict[str, dict[str, list[int]]], cols: list[str], passed: str = "passed") -> None:
    """Grouped bars, one group per key of ``groups``, one bar per column: the outline is tried,
    the filled part passed (hatched where some failed), ``passed/tried`` above each."""
    names = list(groups)
    width = 0.8 / max(len(cols), 1)
    rot = 90 if len(cols) > 2 else 0  # narrow bars: the counts upright
    for j, col in enumerate(cols):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(names))]
        cells = [groups[n].get(col, [0, 0]) for n in names]
        ax.bar(xs, [c[1] for c in cells], width, fill=False, edgecolor="0.5", linewidth=0.8)
        filled = ax.bar(xs, [c[0] for c in cells], width * 0.9, color=f"C{j}", label=col or None)
        for x, (ok, tried), b in zip(xs, cells, filled):
            if tried:
                ax.text(x, tried, f" {ok}/{tried}", ha="center", va="bottom", fontsize=7, rotation=rot)
                b.set_hatch("" if ok == tried else "//")
    top = max((c[1] for g in groups.values() for c in g.values()), default=1)
    ax.set_ylim(0, top * 1.18)  # room for the counts
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(f"tried (outline), {passed} (filled)")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(axis="y", alpha=0.3)


def verdict(groups: dict[str, dict[str, list[int]]]) -> str:
    ok = sum(c[0] for g in groups.values() for c in g.values())
    tried = sum(c[1] for g in groups.values() for c in g.values())
    return f"{ok} / {tried}"


# ---- the subcommands -------------------------------------------------------------------------


def saved(out_dir: Path, name: str, replot: bool) -> Path | None:
    return out_dir / f"{name}.json" if replot else None


def fig_kill_sweep(paths: list[Path], out_dir: Path) -> None:
    sweeps = [json.loads(p.read_text()) for p in paths]
    groups = aggregate_kills(sweeps)
    phases = [p for p in PHASES.values() if any(p in g for g in groups.values())]
    by_phase = {ph: {label: g[ph] for label, g in groups.items() if ph in g} for ph in phases}
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.2))
    bars(ax, by_phase, list(groups), "survived")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend above the bars
    ax.legend(fontsize=8, ncol=5, loc="upper center")
    ax.set_xlabel("where the run was SIGKILLed (kind of fault point)")
    wall = sum(s["wall_s"] for s in sweeps)
    cpus = {s["cpus"] for s in sweeps}
    fig.suptitle(
        f"kill -9 then resume, bit-identical final checkpoint and metrics: {verdict(groups)} points survived\n"
        f"scripts/kill_sweep.py, {len(sweeps)} sweeps, {wall:.0f} s in all on {'/'.join(map(str, cpus))} CPUs",
        fontsize=9,
    )
    res = {"groups": groups, "sweeps": [str(p.relative_to(ROOT)) for p in paths], "wall_s": wall}
    save(fig, "kill_sweep", res, out_dir)


def fig_weightsync(broadcast: bool, out_dir: Path, replot: bool = False) -> None:
    records, m = run_tests(
        [*WEIGHTSYNC_TESTS, *([BROADCAST_TEST] if broadcast else [])],
        saved(out_dir, "weightsync_corruption", replot),
    )
    groups = tally(records, sync_case)
    cols = [t for t in TRANSPORTS if any(t in g for g in groups.values())]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.2))
    bars(ax, groups, cols, "detected")
    ax.legend(fontsize=8)
    ax.set_xlabel("fault injected into one sync (control: none)")
    fig.suptitle(
        f"weight-sync corruption: {verdict(groups)} tests passed (fault raised, nothing corrupted loaded;"
        f" control loaded bit-exact)\n{where(m)}",
        fontsize=9,
    )
    save(fig, "weightsync_corruption", {"groups": groups, "machine": asdict(m), "tests": records}, out_dir)


def fig_component_death(out_dir: Path, replot: bool = False) -> None:
    records, m = run_tests(
        ["-m", "slow", DEATH_TEST, "-k", DEATH_K], saved(out_dir, "component_death", replot)
    )
    rows = death_rows(records)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    xs = list(range(len(rows)))
    ax.bar(xs, [r[1] or 0.0 for r in rows], 0.6, label="exited after the fault (s)")
    ax.hlines([r[2] for r in rows], [x - 0.4 for x in xs], [x + 0.4 for x in xs], colors="red",
              linestyles="--", label="bound asserted (s)")  # fmt: skip
    for x, (_, s, _bound, outcome) in zip(xs, rows):
        text = f"{s:.1f} s" if s is not None else "test FAILED\n(see the JSON)"
        color = "black" if outcome == "passed" else "red"
        ax.text(x, s or 1.0, text, ha="center", va="bottom", fontsize=8, color=color)
    ax.set_xticks(xs)
    ax.set_xticklabels([r[0] for r in rows], fontsize=8)
    ax.set_ylabel("seconds from the fault to the run's exit")
    ax.set_ylim(0, max([r[2] for r in rows], default=30.0) * 1.35)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    ok = sum(r[3] == "passed" for r in rows)
    fig.suptitle(
        f"a component dies mid-RL: exit 3 naming it, nothing left running; {ok} / {len(rows)} tests"
        f" passed\n{where(m)}",
        fontsize=9,
    )
    res = {"rows": rows, "machine": asdict(m), "tests": records}
    save(fig, "component_death", res, out_dir)


def fig_mutations(out_dir: Path, replot: bool = False) -> None:
    records, m = run_tests([MUTATION_TEST], saved(out_dir, "recipe_mutations", replot))
    groups = tally(records, mutation_case)
    order = ["typo", "type", "kind", "range", "conflict", "control (unmutated)"]
    groups = {k: groups[k] for k in order if k in groups} | {
        k: v for k, v in groups.items() if k not in order
    }
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    bars(ax, groups, [""], "caught")
    ax.set_xlabel("mutation category (control: the shipped recipe reaches the build)")
    caught = {k: v for k, v in groups.items() if not k.startswith("control")}
    fig.suptitle(
        f"recipe mutations: {verdict(caught)} rejected with exit 2 before any model, message with path,"
        f" value and fix;\ncontrols {verdict({'c': groups.get('control (unmutated)', {})})} reached the"
        f" build; {where(m)}",
        fontsize=9,
    )
    save(fig, "recipe_mutations", {"groups": groups, "machine": asdict(m), "tests": records}, out_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=FIGURES)
    ap.add_argument("--replot", action="store_true", help="redraw from the JSON a run wrote; run nothing")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ks = sub.add_parser("kill-sweep", help="plot kill_sweep.py --json files")
    ks.add_argument("sweeps", type=Path, nargs="+")
    ws = sub.add_parser("weightsync", help="run the weight-sync corruption sweeps")
    ws.add_argument("--broadcast", action="store_true", help="also the gloo broadcast sweep (~60 s)")
    sub.add_parser("component-death", help="run test_component_death.py's kill / hang tests (slow)")
    sub.add_parser("mutations", help="run test_recipe_mutations.py")
    import reliability_figures_server  # §3, §4, §6, §7

    reliability_figures_server.add_commands(sub)
    args = ap.parse_args(argv)
    if hasattr(args, "figure"):
        args.figure(args.out_dir, args.replot)
    elif args.cmd == "kill-sweep":
        fig_kill_sweep([p.resolve() for p in args.sweeps], args.out_dir)
    elif args.cmd == "weightsync":
        fig_weightsync(args.broadcast, args.out_dir, args.replot)
    elif args.cmd == "component-death":
        fig_component_death(args.out_dir, args.replot)
    else:
        fig_mutations(args.out_dir, args.replot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
