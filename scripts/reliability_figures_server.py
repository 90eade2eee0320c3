"""§3, §4, §6 and §7 of docs/reliability.md: the subcommands of scripts/reliability_figures.py that
did not fit its 400 lines. Run them through that script (it registers them); they reuse its
Recorder, ``tally``, ``bars`` and ``save``:

    .venv/bin/python scripts/reliability_figures.py checkpoint-faults   # §3, test_ckpt_faults.py
    .venv/bin/python scripts/reliability_figures.py source-scan         # §4, the unsafe-code scan
    .venv/bin/python scripts/reliability_figures.py server-bad-input    # §6, incl. schemathesis (~15 s)
    .venv/bin/python scripts/reliability_figures.py server-security     # §7

Each runs the test files its section names, in-process, and counts tests passed / run per row of
the section's table, from the test's name and parameters (``*_RULES``: the first fragment found in
``test_name[params]`` gives the row). ``source-scan`` also counts the scan's findings per rule over
the source tree with the test module's own ``findings`` and ``ALLOWED``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability_figures as rf

CKPT_TEST = "packages/unirl-train/tests/test_ckpt_faults.py"
CKPT_RULES = [
    ("disk_full", "disk full (ENOSPC)\nat each of a save's 5 writes"),
    ("read_only", "read-only run directory\n(EACCES / EROFS)"),
    ("rename_failing", "rename fails after the old\ncheckpoint was moved aside"),
]
SCAN_TEST = "tests/test_no_unsafe_deserialization.py"
SCAN_RULES = [  # (fragment of the scan's rule, category), first match wins
    ("import_module", "computed import"),
    ("import ", "import pickle / cloudpickle\n/ dill / marshal / shelve"),
    ("torch.load(", "torch.load without\nweights_only=True"),
    ("torch.jit.load", "torch.jit.load"),
    ("numpy.load", "numpy.load\n(allow_pickle=True)"),
    ("yaml.", "yaml.load / unsafe_load\n/ full_load"),
    ("(", "eval / exec / compile"),
]
REWARD = "packages/unirl-reward/tests/"
BAD_INPUT_TESTS = [REWARD + f for f in ("test_server_bad_input.py", "test_server.py", "test_schemathesis.py")]
JSON_, TYPES, COUNT, SIZE = (
    "malformed JSON",
    "wrong types / shapes",
    "huge item counts",
    "body over the size limit",
)
NAN, IMAGE, VIDEO = "NaN / infinity", "bad images", "bad videos"
SERVE, FUZZ = "bad serve config\n(unknown scorer, queue < batch)", "schemathesis\n(one test per operation)"
CONTROL = "control: good input\nis scored"
BAD_INPUT_RULES: list[tuple[str, str | None]] = [
    ("shape_refusals", None),  # test_schemathesis.py's check of its own helper: not an input
    ("finite_numbers_in_metadata", CONTROL), ("within_the_limits", CONTROL),
    ("non_finite", NAN), ("413", SIZE), ("streamed_body", SIZE),
    ("unknown_scorer", SERVE), ("queue_smaller", SERVE), ("published_contract", FUZZ),
    ("not json", JSON_), ("UTF-8", JSON_), ("truncated JSON", JSON_), ("bare word", JSON_), ("empty body", JSON_),
    ("4097 items", COUNT), ("items over the queue", COUNT),
    ("video", VIDEO), ("image", IMAGE), ("JPEG", IMAGE), ("cannot decode", IMAGE),
    ("test_malformed_payloads", TYPES), ("test_bad_request", TYPES),
]  # fmt: skip
BAD_INPUT_ORDER = [JSON_, TYPES, COUNT, SIZE, NAN, IMAGE, VIDEO, SERVE, FUZZ, CONTROL]
SECURITY_TESTS = [REWARD + "test_server_security.py", REWARD + "test_server.py"]
SECURITY_RULES = [
    ("near_miss", "near-miss tokens -> 401\n(prefix, case, scheme, ...)"),
    ("auth_required", "missing / wrong / Basic\ncredentials -> 401"),
    ("token_guards_every_path", "missing / wrong / Basic\ncredentials -> 401"),
    ("before_the_body", "token checked before\nthe body is read"),
    ("constant_time", "token compared in\nconstant time"),
    ("empty_token_is_refused", "empty token refused\n(create_app)"),
    ("public_bind", "public bind needs a token\n(check_bind, serve_in_thread, CLI)"),
    ("loopback", "control: loopback\nneeds no token"),
]


# ---- pure parts (apps/tests/test_reliability_figures.py) ------------------------------------


def rule_case(nodeid: str, rules: list[tuple[str, str | None]]) -> tuple[str, str] | None:
    """(category, test file) of a test node: the first rule whose fragment is in ``name[params]``
    (None: no rule, or a rule of category None)."""
    path, _, test = nodeid.partition("::")
    cat = next((c for frag, c in rules if frag in test), None)
    return None if cat is None else (cat, Path(path).name)


def ckpt_case(nodeid: str) -> tuple[str, str] | None:
    """(fault, checkpoint format) of a test_ckpt_faults.py node; an unparametrised test is ``full``."""
    c = rule_case(nodeid, CKPT_RULES)
    params = nodeid.partition("[")[2].rstrip("]")
    return None if c is None else (c[0], params or "full")


def ordered(groups: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """``groups`` in ``order``, any group not in it after them."""
    return {k: groups[k] for k in order if k in groups} | {k: v for k, v in groups.items() if k not in order}


def scan_counts(found: list[list[Any]]) -> dict[str, list[int]]:
    """``{category: [allow-listed, not allowed]}`` occurrences, from ``[path, rule, lines, reason]``
    rows (reason None: not allow-listed); every category of SCAN_RULES is present, 0 included."""
    out = {c: [0, 0] for c in dict.fromkeys(c for _, c in SCAN_RULES)}
    for _, rule, lines, reason in found:
        cat = next(c for frag, c in SCAN_RULES if frag in rule)
        out[cat][reason is None] += len(lines)
    return out


def fuzz_summary(records: list[dict[str, Any]]) -> tuple[int, dict[int, int]] | None:
    """(requests, {status: count}) from the line test_schemathesis.py prints after its run."""
    for r in records:
        m = re.search(r"schemathesis: (\d+) requests .*by status: \{(.*)\}", r.get("stdout", ""))
        if m:
            return int(m.group(1)), {int(s): int(n) for s, n in re.findall(r"(\d+): (\d+)", m.group(2))}
    return None


# ---- the figures -----------------------------------------------------------------------------


def fig_cases(
    name: str, tests: list[str], case: Any, order: list[str], out_dir: Path, replot: bool
) -> tuple[Any, Any, dict[str, Any], list[dict[str, Any]], Any]:
    """Run ``tests``, tally them with ``case`` and draw the bars; (fig, ax, groups, records, machine)."""
    records, m = rf.run_tests(tests, rf.saved(out_dir, name, replot))
    groups = ordered(rf.tally(records, case), order)
    cols = list(dict.fromkeys(c for g in groups.values() for c in g))
    plt = rf.pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.4))
    rf.bars(ax, groups, cols)
    if len(cols) > 1:
        ax.legend(fontsize=8)
    return fig, ax, groups, records, m


def fig_checkpoint_faults(out_dir: Path, replot: bool = False) -> None:
    name = "checkpoint_faults"
    fig, ax, groups, records, m = fig_cases(
        name, [CKPT_TEST], ckpt_case, [c for _, c in CKPT_RULES], out_dir, replot
    )
    ax.set_xlabel("fault during a checkpoint save (bars: checkpoint format)")
    fig.suptitle(
        f"checkpoint faults: {rf.verdict(groups)} tests passed (one OSError, errno kept; nothing half-written"
        f" left; the last complete\ncheckpoint loads bit-exact; a disk-full test covers all 5 writes)"
        f"; {rf.where(m)}",
        fontsize=9,
    )
    rf.save(fig, name, {"groups": groups, "machine": asdict(m), "tests": records}, out_dir)


def scan_tree() -> dict[str, Any]:
    """Every finding of the §4 scan over the source tree, with its allow-list reason (or None)."""
    spec = importlib.util.spec_from_file_location("unsafe_scan", rf.ROOT / SCAN_TEST)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    found: dict[tuple[str, str], list[int]] = {}
    for path in mod.SOURCES:
        for line, rule in mod.findings(path.read_text()):
            found.setdefault((str(path.relative_to(rf.ROOT)), rule), []).append(line)
    rows = [[p, r, lines, mod.ALLOWED.get((p, r))] for (p, r), lines in sorted(found.items())]
    return {"modules": len(mod.SOURCES), "findings": rows}


def fig_source_scan(out_dir: Path, replot: bool = False) -> None:
    name = "source_scan"
    records, m = rf.run_tests([SCAN_TEST], rf.saved(out_dir, name, replot))
    scan = json.loads((out_dir / f"{name}.json").read_text())["scan"] if replot else scan_tree()
    counts = scan_counts(scan["findings"])
    tests = {r["nodeid"].partition("::")[2]: r for r in records}
    groups = {
        t.removeprefix("test_").replace("_", " "): {"": [int(r["outcome"] == "passed"), 1]}
        for t, r in tests.items()
    }
    plt = rf.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [1, 2.4]})
    rf.bars(ax1, groups, [""])
    ax1.set_xticklabels([g.replace(" in the", "\nin the").replace(" what", "\nwhat") for g in groups], rotation=0,
                        ha="center", fontsize=7)  # fmt: skip
    ys = list(range(len(counts)))
    ok, bad = [c[0] for c in counts.values()], [c[1] for c in counts.values()]
    ax2.barh(ys, ok, color="0.6", label="allow-listed (with its reason)")
    ax2.barh(ys, bad, left=ok, color="red", label="not allowed (fails the test)")
    for y, a, b in zip(ys, ok, bad):
        ax2.text(a + b + 0.05, y, f" {a} allow-listed, {b} not", va="center", fontsize=8)
    ax2.set_yticks(ys)
    ax2.set_yticklabels(list(counts), fontsize=8)
    ax2.invert_yaxis()
    ax2.set_xlim(0, max(a + b for a, b in zip(ok, bad)) * 1.6 + 1)
    ax2.set_xlabel(f"occurrences in the {scan['modules']} modules of packages/*/src and apps/src")
    ax2.legend(fontsize=8, loc="lower right")
    n_bad = sum(bad)
    fig.suptitle(
        f"source scan for unsafe deserialisation / evaluation: {n_bad} findings outside the allow-list,"
        f" {sum(ok)} allow-listed ({sum(f[3] is not None for f in scan['findings'])} files); tests {rf.verdict(groups)} passed\n{rf.where(m)}",
        fontsize=9,
    )
    res = {"counts": counts, "scan": scan, "machine": asdict(m), "tests": records}
    rf.save(fig, name, res, out_dir)


def fig_server_bad_input(out_dir: Path, replot: bool = False) -> None:
    name = "server_bad_input"
    fig, ax, groups, records, m = fig_cases(
        name, BAD_INPUT_TESTS, lambda n: rule_case(n, BAD_INPUT_RULES), BAD_INPUT_ORDER, out_dir, replot
    )
    ax.set_xlabel("bad input (bars: test file)")
    fuzz = fuzz_summary(records)
    told = "schemathesis did not report (its line is printed at its module's teardown)"
    if fuzz is not None:
        errors = sum(n for status, n in fuzz[1].items() if status >= 500)
        told = f"schemathesis: {fuzz[0]} requests, {errors} server errors (5xx); by status {fuzz[1]}"
    fig.suptitle(
        f"reward server bad input: {rf.verdict(groups)} tests passed (4xx naming the field, nothing scored, the"
        f" next good request answered)\n{told}; {rf.where(m)}",
        fontsize=9,
    )
    res = {"groups": groups, "schemathesis": fuzz, "machine": asdict(m), "tests": records}
    rf.save(fig, name, res, out_dir)


def fig_server_security(out_dir: Path, replot: bool = False) -> None:
    name = "server_security"
    order = list(dict.fromkeys(c for _, c in SECURITY_RULES))
    fig, ax, groups, records, m = fig_cases(
        name, SECURITY_TESTS, lambda n: rule_case(n, SECURITY_RULES), order, out_dir, replot
    )
    ax.set_xlabel("security check (bars: test file)")
    fig.suptitle(
        f"reward server security: {rf.verdict(groups)} tests passed (401 for every token but the"
        f" right one, no bind beyond loopback\nwithout a token; the timing benchmark is not in it)"
        f"; {rf.where(m)}",
        fontsize=9,
    )
    rf.save(fig, name, {"groups": groups, "machine": asdict(m), "tests": records}, out_dir)


COMMANDS = {
    "checkpoint-faults": (fig_checkpoint_faults, "run test_ckpt_faults.py (§3)"),
    "source-scan": (fig_source_scan, "run the unsafe-deserialisation scan (§4)"),
    "server-bad-input": (fig_server_bad_input, "run the reward server's bad-input tests + schemathesis (§6)"),
    "server-security": (fig_server_security, "run the reward server's security tests (§7)"),
}


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register COMMANDS on reliability_figures.py's subparsers; ``args.figure(out_dir, replot)``."""
    for cmd, (fn, help_) in COMMANDS.items():
        sub.add_parser(cmd, help=help_).set_defaults(figure=fn)
