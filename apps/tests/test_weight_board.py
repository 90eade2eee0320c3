"""The Ray async lifecycle's weight board: who may read which staged version, and when a version's
payload may be freed (superseded and unread, or acked by every rollout worker)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from unirl.apps.distributed.board import WeightBoard
from unirl.distributed.errors import StaleWeightVersionError
from unirl.distributed.weightsync import SharedMemoryWeightSync, SyncAck, SyncTicket


def ticket(step: int) -> SyncTicket:
    return SyncTicket("buckets", step, f"sum{step}", (), (), ())


def ack(step: int, rank: int) -> SyncAck:
    return SyncAck(f"rollout{rank}", step, f"sum{step}", 3)


def read(board: WeightBoard, rank: int) -> int | None:
    """Worker ``rank`` claims the newest version and loads it; the version, None if up to date."""
    claim = board.claim(rank)
    if claim is None:
        return None
    version, t = claim
    board.done(rank, version, None if t is None else ack(t.version, rank))
    return version


def test_a_version_is_freed_once_every_worker_acked_it() -> None:
    board = WeightBoard(readers=2)
    board.post(0, None)  # the workers already hold the SFT result: nothing to free
    assert [read(board, r) for r in (0, 1)] == [0, 0] and board.collect() == []
    board.post(1, ticket(10))
    assert read(board, 0) == 1 and board.collect() == []  # rollout1 will still read it
    assert read(board, 0) is None  # up to date: no second pull
    assert read(board, 1) == 1
    [(t, acks, n)] = board.collect()
    assert (t.version, [a.receiver for a in acks], n) == (10, ["rollout0", "rollout1"], 2)
    assert board.held_versions() == [1, 1] and board.collect() == []


def test_a_superseded_version_waits_for_the_pull_in_progress() -> None:
    board = WeightBoard(readers=2)
    board.post(1, ticket(10))
    claim = board.claim(0)  # rollout0 starts pulling v1 (mid-generation, say)
    assert claim is not None and claim[0] == 1
    board.post(2, ticket(12))  # the trainer publishes v2 meanwhile
    assert board.collect() == []  # v1 is being read: its buckets must stay
    board.done(0, 1, ack(10, 0))
    [(t, acks, n)] = board.collect()  # superseded, read by one worker: freed with its one ack
    assert (t.version, len(acks), n) == (10, 1, 1)
    assert read(board, 1) == 2 and read(board, 0) == 2  # rollout1 never saw v1
    [(t, acks, n)] = board.collect()
    assert (t.version, n) == (12, 2)


def test_an_unread_superseded_version_is_freed_without_acks() -> None:
    board = WeightBoard(readers=1)
    board.post(1, ticket(10))
    board.post(2, ticket(12))
    [(t, acks, n)] = board.collect()
    assert (t.version, acks, n) == (10, [], 0)


def test_versions_must_increase_and_done_must_match_a_claim() -> None:
    board = WeightBoard(readers=1)
    board.post(3, ticket(10))
    with pytest.raises(StaleWeightVersionError, match="policy v3 posted after v3"):
        board.post(3, ticket(11))
    with pytest.raises(RuntimeError, match="rollout0 reports v3, which it did not claim"):
        board.done(0, 3, ack(10, 0))


class BoardWorker:
    """A rollout worker's board-facing half in this process: the real AR pipeline, a real
    shared-memory receiver (verified buckets into the model's parameters)."""

    def __init__(self, board: Any, rank: int) -> None:
        from unirl.rollout.ar import ARPipeline, CausalLMBundle
        from unirl.types import ARSamplingParams

        self.info, self.board, self.policy_version = SimpleNamespace(rank=rank), board, -1
        bundle = CausalLMBundle.tiny_qwen3(seed=2)
        self.params = dict(bundle.model.named_parameters())
        self.pipeline = ARPipeline(
            bundle, ARSamplingParams(max_new_tokens=12, temperature=1.0, seed=1), stop_at_eos=False
        )
        self.sync = SharedMemoryWeightSync(name=f"rollout{rank}", is_source=False)
        self.step = 0

    def pull(self, t: SyncTicket | None) -> SyncAck:
        def sink(bucket: dict[str, torch.Tensor]) -> None:
            with torch.no_grad():
                for n, x in bucket.items():
                    self.params[n].copy_(x)

        a = self.sync.receive(t, sink)
        self.step = a.version
        return a

    def weight_version(self) -> int:
        return self.step


class Trainer:
    """Posts one "RL step" of a trained model (seeded noise) per version through shared memory."""

    def __init__(self, board: Any) -> None:
        from unirl.rollout.ar import CausalLMBundle

        self.board, self.model = board, CausalLMBundle.tiny_qwen3(seed=3).model
        self.sync = SharedMemoryWeightSync(name="trainer")

    def publish(self, version: int) -> None:
        import ray

        g = torch.Generator().manual_seed(version)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(0.3 * p.std().nan_to_num() * torch.randn(p.shape, generator=g))
        t = self.sync.push(list(self.model.named_parameters()), 100 + 2 * version)
        ray.get(self.board.post.remote(version, t))

    def free(self) -> int:
        import ray

        done = ray.get(self.board.collect.remote())
        for t, acks, n in done:
            self.sync.confirm(t, acks, n)
        return len(done)


@pytest.mark.slow
def test_a_ray_worker_swaps_to_each_posted_version_mid_generation(ray_cluster: Any) -> None:
    """The board as a Ray actor: a generation in progress asks it between chunks, pulls each newly
    posted version (verified) and goes on; tokens record their version, and every version's shared
    memory is freed once read."""
    import ray

    from unirl.apps.distributed.board import BoardSwap, catch_up
    from unirl.rollout.ar import PartialRollouts
    from unirl.types import Sample, TextPrimitive, TextSegment

    torch.set_num_threads(1)
    board = ray.remote(num_cpus=0)(WeightBoard).remote(1)
    trainer, worker = Trainer(board), BoardWorker(board, 0)

    class TrainerPostsAfterEachSwap(BoardSwap):
        def swap(self) -> None:
            super().swap()
            if worker.policy_version < 2:
                trainer.publish(worker.policy_version + 1)

    trainer.publish(0)
    assert catch_up(worker) == (0, 100)  # between batches: the controller's refresh
    trainer.publish(1)  # posted before the generation: found at the first chunk
    worker.pipeline.enable_partial(PartialRollouts(TrainerPostsAfterEachSwap(worker), chunk_tokens=3))
    samples = [Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text=t)]) for i, t in enumerate("ab?1")]
    worker.pipeline.generate(samples, rollout_step=0)
    for s in samples:
        seg = s.part("ar").segment
        assert isinstance(seg, TextSegment) and seg.token_versions() == [0] * 3 + [1] * 3 + [2] * 6
        assert [(v.start, v.weight_version) for v in seg.versions or []] == [(0, 100), (3, 102), (6, 104)]
    for n, p in trainer.model.named_parameters():  # the worker holds the trainer's last version
        assert torch.equal(worker.params[n], p), n
    assert ray.get(board.held_versions.remote()) == [2]
    assert trainer.free() == 3 and trainer.sync._segments == {}  # v0, v1 and v2, each read once
    assert catch_up(worker) == (2, 104)  # up to date: nothing pulled
    ray.kill(board)
