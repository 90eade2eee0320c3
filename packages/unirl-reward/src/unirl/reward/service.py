"""RewardService: one Python API over local scorers or a remote reward server.

```python
svc = RewardService.local(ServiceConfig.from_yaml("scorers.yaml"))   # in-process
svc = RewardService.remote("http://127.0.0.1:8000", token=...)        # same API over HTTP
results = svc.score([ScoreItem(response="... \\boxed{4}", reference="4")])
svc.score_samples(samples, part_name="ar")        # fills Part.reward on each Sample
```
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from unirl.reward.combine import WeightedScorer, check_unique, combine, identity
from unirl.reward.config import ServiceConfig
from unirl.reward.media import to_rgb_uint8
from unirl.reward.protocol import ScoreItem, ScoreResult
from unirl.types import ImagePrimitive, Reward, Sample, TextPrimitive, VideoPrimitive, to_numpy
from unirl.types.wire import VersionResponse


class Backend(Protocol):
    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]: ...

    def identity(self) -> str: ...

    def close(self) -> None: ...


class LocalBackend:
    """Runs the weighted scorers in this process."""

    def __init__(self, scorers: Sequence[WeightedScorer]) -> None:
        check_unique(scorers)
        self.scorers = list(scorers)
        self._identity = identity(self.scorers)

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        return combine(self.scorers, items) if items else []

    def identity(self) -> str:
        return self._identity

    def close(self) -> None:
        for ws in self.scorers:
            close = getattr(ws.scorer, "close", None)
            if callable(close):
                close()


class RemoteBackend:
    """Sends items to a reward server through `RewardClient` (retries, idempotent ids)."""

    def __init__(self, url: str, **client_kw: Any) -> None:
        from unirl.reward.client import RewardClient

        self.client = RewardClient(url, **client_kw)

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        return self.client.score(items) if items else []

    def identity(self) -> str:
        return self.client.version().identity

    def close(self) -> None:
        self.client.close()


class RewardService:
    """Weighted reward: `score(items)` -> ScoreResult(total, components) per item."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @classmethod
    def local(cls, scorers: ServiceConfig | Sequence[WeightedScorer]) -> RewardService:
        built = scorers.build() if isinstance(scorers, ServiceConfig) else list(scorers)
        return cls(LocalBackend(built))

    @classmethod
    def from_config(cls, cfg: ServiceConfig) -> RewardService:
        """In-process scorers, or the reward server of `cfg.remote` after checking that it scores
        with `cfg.scorers` (names and weights, as `GET /v1/version` lists them)."""
        if cfg.remote is None:
            return cls.local(cfg)
        import os

        from unirl.reward.client import RetryPolicy

        r = cfg.remote
        token = None
        if r.token_env is not None:
            token = os.environ.get(r.token_env)
            if not token:
                raise ValueError(
                    f"reward.remote.token_env={r.token_env!r}: the variable is unset or empty; export the "
                    "server's bearer token in it, or drop token_env for a loopback server without one"
                )
        svc = cls.remote(
            r.url, token=token, timeout_s=r.timeout_s, retry=RetryPolicy(max_attempts=r.max_attempts),
            media=r.media,
        )  # fmt: skip
        if r.check_scorers:
            try:
                check_server_scorers(cfg, svc.version())
            except Exception:
                svc.close()
                raise
        return svc

    def version(self) -> VersionResponse:
        """The remote server's scorer list (`GET /v1/version`); a local service has none."""
        if not isinstance(self.backend, RemoteBackend):
            raise TypeError("RewardService.version: only a remote service has a server to ask")
        return self.backend.client.version()

    @classmethod
    def remote(cls, url: str, **client_kw: Any) -> RewardService:
        """Client of a reward server; `client_kw` go to `RewardClient` (token, timeout_s, retry, media)."""
        return cls(RemoteBackend(url, **client_kw))

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        return self.backend.score(items)

    def identity(self) -> str:
        """Hash of scorer names/versions/weights (the server's, for a remote backend)."""
        return self.backend.identity()

    def score_samples(
        self, samples: Sequence[Sample], part_name: str, prompt_part: str | None = None
    ) -> list[Reward]:
        """Score `part_name` of every Sample and set its `Part.reward`; returns the rewards in order.

        The item for a Sample reads: prompt = the text output of `prompt_part` if given (e.g. the
        `ar` rewrite that conditioned a `diffusion` part) else the Sample's first text input;
        response/image/video = the part's first output of each kind; reference =
        `metadata.answer`; metadata = `metadata.spec`.
        """
        items = [sample_to_item(s, part_name, prompt_part) for s in samples]
        results = self.score(items)
        rewards = []
        for s, r in zip(samples, results):
            reward = Reward(total=r.total, components=dict(r.components))
            s.part(part_name).reward = reward
            rewards.append(reward)
        return rewards

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> RewardService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sample_to_item(sample: Sample, part_name: str, prompt_part: str | None = None) -> ScoreItem:
    """The ScoreItem for one Sample's part (see `RewardService.score_samples`)."""
    part = sample.part(part_name)
    prompt = sample.part(prompt_part).text if prompt_part else _first_text(sample.inputs)
    response = _first_text(part.outputs)
    image = video = None
    for o in part.outputs:
        if isinstance(o, ImagePrimitive) and image is None:
            image = to_rgb_uint8(np.asarray(to_numpy(o.pixels)))
        elif isinstance(o, VideoPrimitive) and video is None:
            video = to_rgb_uint8(np.asarray(to_numpy(o.frames)))
    return ScoreItem(
        prompt=prompt,
        response=response,
        reference=sample.metadata.answer,
        image=image,
        video=video,
        metadata=dict(sample.metadata.spec),
    )


def _first_text(prims: Sequence[Any]) -> str | None:
    for p in prims:
        if isinstance(p, TextPrimitive):
            return p.text
    return None


def check_server_scorers(cfg: ServiceConfig, server: VersionResponse) -> None:
    """Raise ValueError unless the server scores with the scorer names and weights of `cfg`."""
    want = [(e.resolved_name, float(e.weight)) for e in cfg.scorers]
    got = [(s.name, float(s.weight)) for s in server.scorers]
    if sorted(want) != sorted(got):
        url = cfg.remote.url if cfg.remote is not None else "?"

        def fmt(pairs: list[tuple[str, float]]) -> str:
            return ", ".join(f"{n} x {w:g}" for n, w in pairs)

        raise ValueError(
            f"reward.remote.url={url!r} scores with [{fmt(got)}] but reward.scorers is [{fmt(want)}]; "
            "start the server from the recipe's scorers, point reward.remote.url at one that has them, "
            "or set reward.remote.check_scorers=false"
        )
