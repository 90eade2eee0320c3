"""Server settings and the `serve` config file (scorers + server section)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from unirl.reward.config import ServiceConfig
from unirl.reward.media import DEFAULT_MAX_PIXELS


class ServerSettings(BaseModel):
    """How the reward server listens and sheds load. Every field has a safe default."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str = Field("127.0.0.1", description="Bind address; anything but loopback requires a token.")
    port: int = Field(8000, ge=0, le=65535, description="0 picks a free port.")
    max_batch: int = Field(32, ge=1, description="Max items scored in one batch (across requests).")
    max_wait_ms: float = Field(5.0, ge=0, description="Max time the first queued item waits for batch-mates.")
    max_queue_items: int = Field(4096, ge=1, description="Queued items beyond this get 429 + Retry-After.")
    request_timeout_s: float = Field(60.0, gt=0, description="A request not scored by then gets 504.")
    max_request_bytes: int = Field(64 * 2**20, ge=1024, description="Larger bodies get 413.")
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, ge=1, description="Per image (per video: all frames).")
    idempotency_ttl_s: float = Field(600.0, ge=0, description="How long a request_id's answer is kept.")
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="torch intra-op threads in the scorer thread (OpenMP settings are per thread, so "
        "torch.set_num_threads in the main thread does not reach it); None leaves torch's default.",
    )
    token_env: str = Field(
        "UNIRL_REWARD_TOKEN", description="Environment variable holding the bearer token (never in the file)."
    )

    @model_validator(mode="after")
    def _queue_holds_a_batch(self) -> ServerSettings:
        if self.max_queue_items < self.max_batch:
            raise ValueError(
                f"server.max_queue_items={self.max_queue_items} is below server.max_batch={self.max_batch}: "
                "the queue must hold one full batch; raise max_queue_items or lower max_batch"
            )
        return self


class ServeConfig(ServiceConfig):
    """`unirl-reward serve --config FILE`: the scorers plus an optional `server:` section."""

    server: ServerSettings = Field(default_factory=lambda: ServerSettings())

    @model_validator(mode="after")
    def _scores_itself(self) -> ServeConfig:
        if self.remote is not None:
            raise ValueError(
                f"remote={self.remote.url!r}: a reward server scores with its own scorers and does not "
                "forward to another; drop the `remote:` section from the server's config"
            )
        return self

    @classmethod
    def from_yaml(cls, path: str | Path) -> ServeConfig:
        import yaml

        data = yaml.safe_load(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping with `scorers:` (and optional `server:`)")
        return cls.model_validate(data)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond loopback without a bearer token."""
    if not is_loopback(host) and not token:
        raise ValueError(
            f"server.host={host!r} is not loopback, so a bearer token is required: set it in the "
            "environment variable named by server.token_env (default UNIRL_REWARD_TOKEN)"
        )
