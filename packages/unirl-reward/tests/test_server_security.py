"""Security checks test_server.py does not cover: the token compare is constant-time, near-miss
tokens get 401, an empty token is refused, and no bind beyond loopback starts without a token."""

from __future__ import annotations

import ast
import hmac
from pathlib import Path

import httpx
import pytest
from reward_test_helpers import LengthScorer

from unirl.reward.cli import main as cli_main
from unirl.reward.combine import WeightedScorer
from unirl.reward.server import auth
from unirl.reward.server.app import create_app
from unirl.reward.server.runner import serve_in_thread
from unirl.reward.server.settings import check_bind

TOKEN = "s3cret-token-value"


def _app(token: str | None):
    return create_app(lambda: [WeightedScorer("length", 1.0, LengthScorer())], token=token)


@pytest.fixture(scope="module")
def guarded():
    with serve_in_thread(_app(TOKEN)) as h:
        yield h.url


@pytest.mark.parametrize(
    "header",
    [
        "Bearer",
        f"Bearer {TOKEN[:-1]}",  # a prefix
        f"Bearer {TOKEN}x",  # an extension
        f"Bearer {TOKEN.upper()}",
        f"Bearer {TOKEN[::-1]}",  # same length, differs early
        f"Token {TOKEN}",
        TOKEN,
        f"Bearer {TOKEN}\u00e9".encode(),  # non-ASCII bytes after the token
    ],
)
def test_near_miss_tokens_get_401(guarded, header):
    r = httpx.post(
        guarded + "/v1/score", json={"items": [{"response": "x"}]}, headers={"Authorization": header}
    )
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert TOKEN not in r.text


def test_the_token_is_compared_in_constant_time(guarded, monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    for sent in (TOKEN, "x" * len(TOKEN), "short"):
        httpx.get(guarded + "/v1/version", headers={"Authorization": f"Bearer {sent}"})
    assert calls == [(s.encode(), TOKEN.encode()) for s in (TOKEN, "x" * len(TOKEN), "short")]
    # and nothing in auth.py compares with == / != (which returns at the first differing byte)
    tree = ast.parse(Path(auth.__file__).read_text())
    eq = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Compare) and any(isinstance(o, (ast.Eq, ast.NotEq)) for o in n.ops)
    ]
    assert sorted(ast.unparse(n) for n in eq) == ["scheme.lower() == b'bearer'", "scope['type'] == 'http'"]


@pytest.mark.parametrize("token", ["", "   "])
def test_an_empty_token_is_refused(token):
    with pytest.raises(ValueError, match="token is empty"):
        _app(token)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "reward.example.com", ""])
@pytest.mark.parametrize("token", [None, ""])
def test_public_bind_needs_a_token(host, token):
    with pytest.raises(ValueError, match="bearer token is required"):
        check_bind(host, token)
    check_bind(host, TOKEN)  # with one it is allowed


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_bind_needs_no_token(host):
    check_bind(host, None)


def test_serve_in_thread_refuses_a_public_bind_without_a_token(monkeypatch):
    from unirl.reward.server import runner

    built = []
    monkeypatch.setattr(runner.uvicorn, "Server", lambda *a, **k: built.append(a))
    with pytest.raises(ValueError, match="bearer token is required"):
        serve_in_thread(_app(None), host="0.0.0.0")
    assert built == []  # refused before a server (and its socket) was made


def test_cli_refuses_a_public_bind_with_an_empty_token(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("scorers:\n  - scorer: {kind: exact_match}\n")
    monkeypatch.setenv("UNIRL_REWARD_TOKEN", "")
    assert cli_main(["serve", "--config", str(cfg), "--host", "::"]) == 2
    assert "bearer token is required" in capsys.readouterr().err
