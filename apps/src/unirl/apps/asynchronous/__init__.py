"""The asynchronous lifecycle: rollout and training overlapped, with bounded staleness.

A rollout thread samples with its own copy of the policy and fills a :class:`SampleBuffer` with
whole rollout batches (one RL step's groups each, rewards and advantages included); the trainer
takes them, trains, and publishes each new policy version to a :class:`WeightMailbox` the rollout
side swaps in between batches. ``rl.lifecycle: async`` selects it (see ``AsyncConfig``).
"""

from unirl.apps.asynchronous.buffer import Batch, SampleBuffer
from unirl.apps.asynchronous.config import AsyncConfig
from unirl.apps.asynchronous.mailbox import WeightMailbox

__all__ = ["AsyncConfig", "Batch", "SampleBuffer", "WeightMailbox"]
