"""Server counters in the Prometheus text format (no client library needed)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from unirl.reward.server.batcher import BatchStats


@dataclass
class Metrics:
    responses: Counter[int] = field(default_factory=Counter)
    items_requested: int = 0
    latency_sum_s: float = 0.0
    latency_count: int = 0
    rejected_queue_full: int = 0
    timeouts: int = 0

    def observe(self, status: int, latency_s: float) -> None:
        self.responses[status] += 1
        self.latency_sum_s += latency_s
        self.latency_count += 1

    def render(self, stats: BatchStats, queued_items: int, dedup_hits: int) -> str:
        lines = [
            "# TYPE unirl_reward_responses_total counter",
            *(f'unirl_reward_responses_total{{status="{s}"}} {n}' for s, n in sorted(self.responses.items())),
            "# TYPE unirl_reward_items_scored_total counter",
            f"unirl_reward_items_scored_total {stats.items}",
            "# TYPE unirl_reward_batches_total counter",
            f"unirl_reward_batches_total {stats.batches}",
            "# TYPE unirl_reward_batch_size_max gauge",
            f"unirl_reward_batch_size_max {stats.batch_size_max}",
            "# TYPE unirl_reward_scoring_seconds_total counter",
            f"unirl_reward_scoring_seconds_total {stats.busy_s:.6f}",
            "# TYPE unirl_reward_queue_items gauge",
            f"unirl_reward_queue_items {queued_items}",
            "# TYPE unirl_reward_idempotent_hits_total counter",
            f"unirl_reward_idempotent_hits_total {dedup_hits}",
            "# TYPE unirl_reward_rejected_queue_full_total counter",
            f"unirl_reward_rejected_queue_full_total {self.rejected_queue_full}",
            "# TYPE unirl_reward_timeouts_total counter",
            f"unirl_reward_timeouts_total {self.timeouts}",
            "# TYPE unirl_reward_request_seconds summary",
            f"unirl_reward_request_seconds_sum {self.latency_sum_s:.6f}",
            f"unirl_reward_request_seconds_count {self.latency_count}",
        ]
        return "\n".join(lines) + "\n"
