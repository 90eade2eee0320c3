"""SampleBuffer: accounting, the staleness bound and its checkpoint state, under random delays."""

from __future__ import annotations

import random
import threading
import time

import pytest

from unirl.apps.asynchronous import Batch, SampleBuffer
from unirl.apps.asynchronous.buffer import ProducerFailed
from unirl.apps.loop import PromptRecord, make_samples


def _samples(slot: int) -> list:
    recs = [PromptRecord(id=f"p{slot}", prompt="1+1=", answer="2")]
    return make_samples(recs, step=slot, samples_per_prompt=2, split="train", dataset="t")


def _producer(buf: SampleBuffer, rng: random.Random, lag_p: float) -> None:
    """Sleeps stand in for rollout work. With probability ``lag_p`` a batch is labelled one version
    older than the oldest allowed (a weight plane that delivered late), so it must be dropped."""
    while (r := buf.reserve()) is not None:
        slot, min_version = r
        time.sleep(rng.uniform(0, 0.002))
        version = max(min_version, 0)
        late = rng.random() < lag_p and min_version >= 1
        buf.put(Batch(slot, version - 1 if late else version, _samples(slot)))


@pytest.mark.parametrize("max_staleness,capacity", [(0, 1), (1, 2), (2, 4), (3, 2)])
def test_accounting_and_staleness_under_random_delays(max_staleness: int, capacity: int) -> None:
    total = 40
    buf = SampleBuffer(capacity=capacity, max_staleness=max_staleness, total_steps=total)
    rng = random.Random(max_staleness * 10 + capacity)
    th = threading.Thread(target=_producer, args=(buf, random.Random(7), 0.25), daemon=True)
    th.start()
    trained_slots, lags = [], []
    for step in range(total):
        batch, lag = buf.take(step)
        trained_slots.append(batch.slot)
        lags.append(lag)
        time.sleep(rng.uniform(0, 0.002))  # training
        buf.advance(step + 1)
        m = buf.metrics()
        assert m["async/produced"] == m["async/trained"] + m["async/dropped"] + m["async/buffered"]
    buf.close()
    th.join(5)
    assert not th.is_alive()
    assert max(lags) <= max_staleness and sorted(buf.staleness.elements()) == sorted(lags)
    assert trained_slots == sorted(trained_slots) and len(set(trained_slots)) == total
    m = buf.metrics()
    # every slot produced is trained, dropped or still buffered, exactly once
    assert m["async/produced"] == total + m["async/dropped"] + m["async/buffered"]
    assert buf.next_slot == m["async/produced"]
    if max_staleness:
        assert m["async/dropped"] > 0  # the late labels above were caught
        assert max(lags) >= 1  # and rollout did run ahead of training


def test_zero_staleness_alternates_with_training() -> None:
    """max_staleness 0: the batch of step k is sampled only after version k is published."""
    buf = SampleBuffer(capacity=4, max_staleness=0, total_steps=3)
    assert buf.reserve() == (0, 0)
    buf.put(Batch(0, 0, _samples(0)))
    got: list = []
    th = threading.Thread(target=lambda: got.append(buf.reserve()), daemon=True)
    th.start()
    th.join(0.2)
    assert th.is_alive(), "slot 1 started before version 1 was published"
    assert buf.take(0)[1] == 0
    buf.advance(1)
    th.join(5)
    assert got == [(1, 1)]


def test_state_round_trip_requeues_the_batch_in_flight() -> None:
    buf = SampleBuffer(capacity=3, max_staleness=2, total_steps=10)
    for _ in range(2):
        slot, v = buf.reserve()  # type: ignore[misc]
        buf.put(Batch(slot, max(v, 0), _samples(slot), {"groups_with_signal": 0.5}))
    buf.take(0)
    buf.advance(1)
    assert buf.reserve() == (2, 0)  # in flight when the checkpoint is taken
    meta, blob = buf.state()
    assert meta["next_slot"] == 2  # the batch in flight is produced again on resume
    back = SampleBuffer(capacity=3, max_staleness=2, total_steps=10)
    back.restore(meta, blob)
    assert back.metrics() == buf.metrics()
    batch, lag = back.take(1)
    assert (batch.slot, lag, batch.extra) == (1, 1, {"groups_with_signal": 0.5})
    assert [s.id for s in batch.samples] == [s.id for s in _samples(1)]
    with pytest.raises(ValueError, match="holds 0 samples"):
        SampleBuffer(capacity=1, max_staleness=0, total_steps=1).restore(meta, b"")


def test_producer_failure_reaches_the_trainer() -> None:
    buf = SampleBuffer(capacity=1, max_staleness=0, total_steps=2)
    buf.fail(RuntimeError("engine died"))
    with pytest.raises(ProducerFailed, match="engine died"):
        buf.take(0)


def test_report_accounts_for_the_async_run() -> None:
    from unirl.apps.report import async_lines

    rows = [
        {"phase": "rl", "step": k, "time": 2.0 * k, "async/staleness": float(lag), "async/train_wait_s": 0.5,
         "async/rollout_s": 1.5, "async/produced": k + 2.0, "async/trained": k + 1.0, "async/dropped": 0.0,
         "async/buffered": 1.0, "is_weight_clipped_frac": 0.01 * k, "is_weight_raw_max": 1.0 + k}
        for k, lag in enumerate([0, 1, 1])
    ]  # fmt: skip
    text = "\n".join(async_lines([{"phase": "eval", "step": 0}, *rows]))
    assert "0: 1 steps, 1: 2 steps" in text
    assert "produced 4 = trained 3 + dropped 0 (too stale) + still buffered 1" in text
    assert "waited 1.5 s for rollouts over 4.0 s of RL" in text and "sampled 4.5 s" in text
    assert "1.00% of tokens/steps clipped on average, largest raw weight 3.000" in text
    assert async_lines([{"phase": "rl", "step": 0, "time": 0.0}]) == []
