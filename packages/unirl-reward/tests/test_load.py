"""Short load run from a second process (benchmarks/bench_server_load.py): nothing lost or
duplicated, every score right, and dynamic batching pays (8 clients x 3 s per setting)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from unirl.reward.testing import ScorerContract

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_server_load.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_server_load", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_synthetic_scorer_is_exact_and_its_cost_is_per_call():
    torch = pytest.importorskip("torch")
    from unirl.reward.protocol import ScoreItem

    torch.set_num_threads(1)
    scorer = _bench_module().PaddedStackScorer(width=64, layers=2, pad_to=8)
    items = [ScoreItem(response=f"item {i}") for i in range(11)]  # padded to 16 rows
    totals = [r.total for r in scorer.score(items)]
    assert totals == [scorer.expected(it.response) for it in items]  # bit-exact, batched or not
    assert totals == [scorer.score([it])[0].total for it in items]
    assert len(set(totals)) == len(totals)  # a misrouted answer would be seen
    lo, hi = scorer.output_range
    assert all(lo <= t <= hi for t in totals)


class TestPaddedStackScorer(ScorerContract):
    @pytest.fixture
    def scorer(self):
        pytest.importorskip("torch")
        return _bench_module().PaddedStackScorer(width=64, layers=2)

    @pytest.fixture
    def items(self):
        from unirl.reward.protocol import ScoreItem

        return [ScoreItem(response="a"), ScoreItem(response="bb"), ScoreItem(response="")]


@pytest.mark.slow
def test_load_nothing_lost_or_duplicated_and_batching_pays(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "load.json"
    cmd = [sys.executable, str(BENCH), "--clients", "8", "--duration-s", "3", "--out", str(out)]
    subprocess.run(cmd, check=True, timeout=120)
    res = json.loads(out.read_text())
    assert [(r["clients"], r["max_batch"]) for r in res["runs"]] == [(8, 1), (8, 32)]
    for r in res["runs"]:
        assert r["sent"] > 50 and r["lost"] == 0 and r["duplicated"] == 0, r
        assert r["answered"] == r["sent"] == r["scored_once"] == r["scores_checked"], r
        assert r["wrong_score"] == 0 and r["n_errors"] == 0, r
        assert r["p99_ms"] >= r["p50_ms"] > 0
    assert res["runs"][0]["mean_batch_size"] == 1.0
    assert res["runs"][1]["mean_batch_size"] > 1.5  # concurrent requests were batched
    assert res["ratios"]["8"] > 1.5, res["ratios"]
