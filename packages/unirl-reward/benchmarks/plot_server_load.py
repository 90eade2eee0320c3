"""Plot the reward-server load benchmark: throughput and latency against concurrent clients.

    .venv/bin/python packages/unirl-reward/benchmarks/bench_server_load.py --clients 8 16 64 --out load.json
    .venv/bin/python packages/unirl-reward/benchmarks/plot_server_load.py load.json --out docs/figures/server_load.png

One figure, two panels, one line per ``max_batch`` setting of the run (the baseline, 1, and the
batched one): answered requests per second, and p50 (solid) / p99 (dashed) latency, each against
the number of closed-loop clients. The title holds the scorer, the machine's CPU count and load
average, and the 0-lost / 0-duplicated check of every run, so the figure carries its own verdict.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def series(runs: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Runs grouped by max_batch, each group sorted by client count."""
    by_mb: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_mb[int(r["max_batch"])].append(r)
    return {mb: sorted(rs, key=lambda r: r["clients"]) for mb, rs in sorted(by_mb.items())}


def verdict(res: dict[str, Any]) -> str:
    runs = res["runs"]
    lost = sum(r["lost"] for r in runs)
    dup = sum(r["duplicated"] for r in runs)
    wrong = sum(r["wrong_score"] for r in runs)
    sent = sum(r["sent"] for r in runs)
    return f"{sent} requests: {lost} lost, {dup} duplicated, {wrong} wrong scores"


def plot(res: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(10, 4))
    for mb, rs in series(res["runs"]).items():
        xs = [r["clients"] for r in rs]
        (line,) = ax_t.plot(xs, [r["throughput_rps"] for r in rs], "o-", label=f"max_batch={mb}")
        ax_l.plot(xs, [r["p50_ms"] for r in rs], "o-", color=line.get_color(), label=f"p50, max_batch={mb}")
        ax_l.plot(xs, [r["p99_ms"] for r in rs], "s--", color=line.get_color(), label=f"p99, max_batch={mb}")
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_ylabel("answered requests / s")
    ax_l.set_ylabel("latency (ms)")
    ax_l.set_yscale("log")
    ratios = ", ".join(f"{c} clients {r:.2f}x" for c, r in res["ratios"].items())
    load = res.get("loadavg_1min_before_after", ["?", "?"])
    fig.suptitle(
        f"reward server, {res['scorer']} scorer, {res['duration_s']:.0f} s per point, {res.get('cpus', '?')} CPUs "
        f"(load {load[0]:.1f} -> {load[1]:.1f})\n{verdict(res)}; batching ratio: {ratios}",
        fontsize=9,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", type=Path, help="the JSON that bench_server_load.py --out wrote")
    ap.add_argument("--out", type=Path, default=Path("docs/figures/server_load.png"))
    args = ap.parse_args()
    plot(json.loads(args.result.read_text()), args.out)


if __name__ == "__main__":
    main()
