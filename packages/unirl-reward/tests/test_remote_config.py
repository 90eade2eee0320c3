"""`ServiceConfig.remote`: a recipe scores through a reward server that runs its scorers, or fails at start."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from unirl.reward.config import ServiceConfig
from unirl.reward.protocol import ScoreItem
from unirl.reward.server.app import create_app
from unirl.reward.server.runner import serve_in_thread
from unirl.reward.server.settings import ServeConfig
from unirl.reward.service import RewardService

SCORERS = [
    {"name": "answer", "weight": 1.0, "scorer": {"kind": "exact_match", "extractor": "raw"}},
    {"name": "fmt", "weight": 0.25, "scorer": {"kind": "format", "pattern": r"\d+"}},
]
ITEMS = [ScoreItem(response="4", reference="4"), ScoreItem(response="five", reference="5")]


def _cfg(**remote: object) -> ServiceConfig:
    return ServiceConfig.model_validate({"scorers": SCORERS, "remote": remote or None})


def test_a_remote_service_scores_as_the_local_one() -> None:
    local = RewardService.from_config(_cfg())
    app = create_app(lambda: _cfg().build())
    with serve_in_thread(app) as h:
        remote = RewardService.from_config(_cfg(url=h.url))
        try:
            got, want = remote.score(ITEMS), local.score(ITEMS)
        finally:
            remote.close()
    assert [(r.total, dict(r.components)) for r in got] == [(r.total, dict(r.components)) for r in want]
    assert [r.total for r in want] == [1.25, 0.0]


def test_a_server_with_other_scorers_is_refused_at_start() -> None:
    other = ServiceConfig.model_validate({"scorers": [{**SCORERS[0]}, {**SCORERS[1], "weight": 0.5}]})
    with serve_in_thread(create_app(lambda: other.build())) as h:
        with pytest.raises(
            ValueError, match=r"reward.remote.url=.* scores with \[answer x 1, fmt x 0.5\]"
        ) as e:
            RewardService.from_config(_cfg(url=h.url))
        assert "reward.scorers is [answer x 1, fmt x 0.25]" in str(e.value)
        assert "check_scorers=false" in str(e.value)
        unchecked = RewardService.from_config(_cfg(url=h.url, check_scorers=False))
        assert [r.total for r in unchecked.score(ITEMS)] == [1.5, 0.0]
        unchecked.close()


def test_token_env_must_hold_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNIRL_TEST_NO_TOKEN", raising=False)
    with pytest.raises(
        ValueError, match="reward.remote.token_env='UNIRL_TEST_NO_TOKEN': the variable is unset"
    ):
        RewardService.from_config(_cfg(url="http://127.0.0.1:9", token_env="UNIRL_TEST_NO_TOKEN"))


def test_the_token_reaches_a_server_that_requires_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIRL_TEST_TOKEN", "s3cret-token")
    with serve_in_thread(create_app(lambda: _cfg().build(), token="s3cret-token")) as h:
        svc = RewardService.from_config(_cfg(url=h.url, token_env="UNIRL_TEST_TOKEN"))
        assert [r.total for r in svc.score(ITEMS)] == [1.25, 0.0]
        svc.close()
        monkeypatch.setenv("UNIRL_TEST_TOKEN", "wrong")
        with pytest.raises(Exception, match="401"):
            RewardService.from_config(_cfg(url=h.url, token_env="UNIRL_TEST_TOKEN"))


def test_bad_remote_fields_name_the_field() -> None:
    with pytest.raises(ValidationError, match="url"):
        _cfg(url="127.0.0.1:8000")
    with pytest.raises(ValidationError, match="max_attempts"):
        _cfg(url="http://127.0.0.1:8000", max_attempts=0)
    with pytest.raises(ValidationError, match="does not forward"):
        ServeConfig.model_validate({"scorers": SCORERS, "remote": {"url": "http://127.0.0.1:8000"}})
