"""``OriginalPromptReward``: score a rewrite's product against the prompt the user gave.

The prompt-enhancer and unified trainers render or answer a REWRITTEN prompt; what they are
judged on is the original one, so their reward must never see the rewrite.
"""

from __future__ import annotations

import dataclasses

from unirl.reward.service import RewardService, sample_to_item
from unirl.types import Reward, Sample

__all__ = ["OriginalPromptReward"]


class OriginalPromptReward:
    """A RewardService that scores each Part against the ORIGINAL prompt: the record's canonical
    meaning (``metadata.answer``, what the user's terse prompt says in the grammar the checker
    reads) when there is one, else the Sample's own input text. Never the rewrite."""

    def __init__(self, service: RewardService) -> None:
        self.service = service

    def score_samples(
        self, samples: list[Sample], part_name: str, prompt_part: str | None = None
    ) -> list[Reward]:
        if prompt_part is not None:
            raise ValueError(
                "OriginalPromptReward scores against the original prompt; prompt_part must be None"
            )
        items = [sample_to_item(s, part_name) for s in samples]
        items = [
            dataclasses.replace(it, prompt=s.metadata.answer) if s.metadata.answer is not None else it
            for it, s in zip(items, samples)
        ]
        out = []
        for s, r in zip(samples, self.service.score(items)):
            reward = Reward(total=r.total, components=dict(r.components))
            s.part(part_name).reward = reward
            out.append(reward)
        return out
