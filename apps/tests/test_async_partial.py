"""Partial rollouts in the async lifecycle: the rollout copy swaps to each newly published policy
between decode chunks; every token records its version, and staleness counts from the oldest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from unirl.apps import cli
from unirl.apps.asynchronous.buffer import Batch, SampleBuffer
from unirl.apps.asynchronous.mailbox import RolloutCopy, WeightMailbox
from unirl.apps.asynchronous.partial import MailboxSwap, oldest_version, version_metrics
from unirl.apps.config import RecipeError, load
from unirl.apps.run_dir import read_metrics
from unirl.apps.trainers.ar import Recipe
from unirl.rollout.ar import ARPipeline, CausalLMBundle, PartialRollouts
from unirl.types import ARSamplingParams, Part, Sample, TextPrimitive, TextSegment

PROMPTS = ["1+2=", "a longer prompt with more tokens", "33*3=", "?", "5-9=", "hello"]


class TrainerPublishesMidGeneration(MailboxSwap):
    """The real mailbox swap; after each swap the "trainer" takes another step and publishes it,
    so the next chunk boundary finds a newer version again (until ``last``)."""

    def __init__(
        self, copy: RolloutCopy, mailbox: WeightMailbox, trained: torch.nn.Module, last: int
    ) -> None:
        super().__init__(copy, mailbox)
        self.trained, self.last = trained, last

    def swap(self) -> None:
        super().swap()
        if self.copy.version < self.last:
            publish_step(self.mailbox, self.trained, self.copy.version + 1)


def publish_step(mailbox: WeightMailbox, trained: torch.nn.Module, version: int) -> None:
    """One "RL step" of the trained policy (seeded noise), published as ``version`` (optimizer
    step 100 + 2 * version: two updates per batch after 100 SFT steps)."""
    g = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.3 * p.std().nan_to_num() * torch.randn(p.shape, generator=g))
    mailbox.publish(version, 100 + 2 * version, trained.named_parameters())


def test_tokens_record_their_version_and_staleness_counts_from_the_oldest() -> None:
    torch.set_num_threads(1)
    trained = CausalLMBundle.tiny_qwen3(seed=3).model
    rollout = CausalLMBundle.tiny_qwen3(seed=2)
    mailbox, copy = WeightMailbox(), RolloutCopy(rollout.model)
    mailbox.publish(0, 100, trained.named_parameters())
    assert copy.refresh(mailbox, 0) == 0
    publish_step(mailbox, trained, 1)  # published before the generation: found at the first chunk
    swap = TrainerPublishesMidGeneration(copy, mailbox, trained, last=2)
    pipe = ARPipeline(
        rollout, ARSamplingParams(max_new_tokens=12, temperature=1.0, seed=1), stop_at_eos=False
    )
    pipe.enable_partial(PartialRollouts(swap, chunk_tokens=3))
    samples = [
        Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text=t)]) for i, t in enumerate(PROMPTS)
    ]
    pipe.generate(samples, rollout_step=0)
    assert swap.swaps == 2 and copy.version == 2
    for s in samples:
        seg = s.part("ar").segment
        assert isinstance(seg, TextSegment) and len(seg.response_ids) == 12  # no stop: every row runs to 12
        # tokens 0-2 by v0, 3-5 by v1, 6-11 by v2; each span stamped with its optimizer step
        assert seg.token_versions() == [0] * 3 + [1] * 3 + [2] * 6
        assert [(v.start, v.weight_version) for v in seg.versions or []] == [(0, 100), (3, 102), (6, 104)]
        assert copy.stamp is not None and copy.stamp.version == 104
    # trained at version 3: the newest tokens lag 1, the oldest 3; staleness is the oldest's
    assert oldest_version(samples, "ar", default=99) == 0
    m = version_metrics(samples, "ar", trained_version=3)
    assert m == {
        "async/versions_per_sample_mean": 3.0,
        "async/versions_per_sample_max": 3.0,
        "async/interrupted_frac": 1.0,
        "async/sample_staleness_mean": 3.0,
        # 3 tokens 3 behind, 3 tokens 2 behind, 6 tokens 1 behind: 21 / 12
        "async/token_staleness_mean": 1.75,
    }
    buf = SampleBuffer(capacity=2, max_staleness=2, total_steps=8)
    buf.put(Batch(0, oldest_version(samples, "ar", default=2), samples))  # too stale by its oldest
    plain = Part(name="ar", segment=TextSegment(prompt_ids=[1], response_ids=[2]))
    fresh = [Sample(id="f", group_id="f", inputs=[TextPrimitive(text="1+1=")], parts=[plain])]
    buf.put(Batch(1, oldest_version(fresh, "ar", default=2), fresh))  # no versions: its start
    batch, lag = buf.take(3)
    assert (batch.slot, lag, buf.dropped, buf.trained) == (1, 1, 1, 1)


def test_partial_rollouts_config_errors_name_the_field() -> None:
    with pytest.raises(RecipeError, match="rl.buffer.partial_rollouts=true needs rl.lifecycle='async'"):
        load(Recipe, "arithmetic_grpo", ["rl.buffer.partial_rollouts=true"])
    # the Ray layout takes it: its rollout workers swap on the weight board mid-generation
    ray = load(
        Recipe,
        "arithmetic_grpo",
        ["rl.lifecycle=async", "rl.buffer.partial_rollouts=true", "layout.kind=ray"],
    )
    assert ray.rl is not None and ray.rl.buffer.partial_rollouts
    with pytest.raises(RecipeError, match="rl.buffer.partial_chunk_tokens"):
        load(Recipe, "arithmetic_grpo", ["rl.lifecycle=async", "rl.buffer.partial_chunk_tokens=0"])
    from unirl.apps.trainers.diffusion_config import Recipe as DiffusionRecipe

    with pytest.raises(RecipeError, match="partial_rollouts=true is for AR recipes"):
        load(DiffusionRecipe, "shapes_nft", ["rl.lifecycle=async", "rl.buffer.partial_rollouts=true"])


def test_off_policy_weights_use_each_tokens_own_behaviour_logprob() -> None:
    """Decoupled PPO on a partial rollout, trained at the newer version: with `old_logprobs:
    recompute` the proximal policy is the trainer's replay, and the weight exp(old_logprobs - behavior_logprobs) is 1
    on the tokens that version sampled and exp(replay_new - replay_old) on the older ones. A band
    of 1 +- 1e-4 therefore masks out exactly the tokens sampled before the swap."""
    from unirl.train.algorithms import GRPOConfig, OffPolicyConfig
    from unirl.train.algorithms.base import BatchTotals

    torch.set_num_threads(1)
    trained = CausalLMBundle.tiny_qwen3(seed=3).model
    rollout = CausalLMBundle.tiny_qwen3(seed=2)
    mailbox, copy = WeightMailbox(), RolloutCopy(rollout.model)
    mailbox.publish(0, 0, trained.named_parameters())
    copy.refresh(mailbox, 0)
    publish_step(mailbox, trained, 1)
    k, params = 2, ARSamplingParams(max_new_tokens=8, temperature=1.0, seed=4)
    pipe = ARPipeline(rollout, params, stop_at_eos=False)
    pipe.enable_partial(PartialRollouts(MailboxSwap(copy, mailbox), chunk_tokens=k))
    samples = [
        Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text=t)]) for i, t in enumerate(PROMPTS)
    ]
    parts = [s.part("ar") for s in pipe.generate(samples, rollout_step=0)]
    for i, p in enumerate(parts):
        p.advantage = 1.0 if i % 2 else -1.0
    # the trainer's policy is version 1: the copy holds it now, so replay through the copy's pipeline
    alg = GRPOConfig(
        old_logprobs="recompute", off_policy=OffPolicyConfig(mode="mask", c_min=1 - 1e-4, c_max=1 + 1e-4)
    ).build()
    alg.prepare(parts, pipe)
    n = sum(len(p.segment.response_ids) for p in parts)  # type: ignore[union-attr]
    _, m = alg.loss(parts, pipe, BatchTotals(num_samples=len(parts), num_tokens=n, num_steps=0))
    old_tokens = k * len(parts)  # every row is 8 long (no stop): tokens 0..k-1 are version 0's
    assert m["is_weight_clipped_frac"] == pytest.approx(old_tokens / n, abs=1e-9)
    assert m["is_weight_mean"] == pytest.approx(1 - old_tokens / n, abs=1e-9)
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # first update: new_logprobs == old_logprobs


@pytest.mark.slow
def test_async_arithmetic_with_partial_rollouts_trains(tmp_path: Path) -> None:
    """arithmetic_dapo (dynamic sampling: rollout slower than training, so publications land
    mid-generation) with partial rollouts checked every token and the decoupled-PPO correction."""
    run = tmp_path / "run"
    args = ["train", "arithmetic_dapo", "sft.steps=40", "rl.steps=6", "eval.num_prompts=8", "eval.every=0",
            "threads=1", "rl.lifecycle=async", "rl.buffer.partial_rollouts=true", "rl.buffer.partial_chunk_tokens=1",
            "rl.algorithm.old_logprobs=recompute", "rl.algorithm.off_policy={mode: truncate, cap: 2.0}",
            "--run-dir", str(run)]  # fmt: skip
    assert cli.main(args) == 0
    rl = [r for r in read_metrics(run / "metrics.jsonl") if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == list(range(6))
    assert [int(r["async/slot"]) for r in rl] == list(range(6))
    for r in rl:
        assert r["async/produced"] == r["async/trained"] + r["async/dropped"] + r["async/buffered"], r
        assert r["async/staleness"] <= 1 and r["async/sample_staleness_mean"] <= r["async/staleness"]
        assert r["async/token_staleness_mean"] <= r["async/sample_staleness_mean"]
        assert 1.0 <= r["async/versions_per_sample_mean"] <= r["async/versions_per_sample_max"] <= 2.0
        assert (r["async/interrupted_frac"] > 0) == (r["async/versions_per_sample_max"] == 2.0)
        assert 0.0 < r["is_weight_mean"] <= 2.0 and r["grad_norm"] > 0 and r["num_optimizer_steps"] > 0
    assert rl[-1]["async/trained"] == 6
    buf = json.loads((run / "checkpoints" / "latest" / "extra.json").read_text())["async"]
    assert buf["trained"] == 6 and buf["produced"] == 6 + buf["dropped"] + len(buf["batches"])
