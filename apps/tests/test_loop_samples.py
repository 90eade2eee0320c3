"""RL batches: a record drawn twice in one step (an epoch boundary) makes two groups, not one of 2x."""

from collections import Counter

from unirl.apps.data import PromptRecord, draw
from unirl.apps.loop import make_samples


def test_a_record_drawn_twice_gets_its_own_group_and_sample_ids() -> None:
    records = [PromptRecord(id=f"p{i}", prompt=f"prompt {i}") for i in range(5)]
    # 5 records, 4 per step: step 1 takes the last record of epoch 0 and 3 of epoch 1
    batches = [draw(records, 4, seed=s, step=1) for s in range(50)]
    dup = next(b for b in batches if len({r.id for r in b}) < len(b))
    samples = make_samples(dup, step=1, samples_per_prompt=3, split="train", dataset="t")
    sizes = Counter(s.group_id for s in samples)
    assert len(sizes) == 4 and set(sizes.values()) == {3}
    assert len({s.id for s in samples}) == 12
    twice = next(r.id for r in dup if sum(x.id == r.id for x in dup) == 2)
    assert {f"train1/{twice}", f"train1/{twice}~1"} <= set(sizes)
