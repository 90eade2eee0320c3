"""The vLLM server's command line: no secret on it, values argparse cannot misread (no vLLM needed)."""

from __future__ import annotations

import argparse

from unirl.rollout.engines.vllm_backends import API_KEY_ENV, server_argv


def _parse(argv: list[str]) -> argparse.Namespace:
    """A parser shaped like vLLM's for the flags used here (every option takes one value)."""
    p = argparse.ArgumentParser()
    for flag in ("--model", "--host", "--port", "--served-model-name", "--seed", "--api-key"):
        p.add_argument(flag)
    p.add_argument("--enforce-eager", action="store_true")
    ns, _ = p.parse_known_args(argv[3:])  # past `python -m vllm.entrypoints...`
    return ns


def test_the_api_key_is_not_on_the_command_line() -> None:
    argv = server_argv("/models/tiny", 8123, {})
    assert not any("api-key" in a for a in argv)  # `ps` shows argv to every user of the machine
    assert API_KEY_ENV == "VLLM_API_KEY"


def test_values_that_start_with_a_dash_are_not_read_as_options() -> None:
    # a random token or a negative number once failed the server's argparse ("expected one argument")
    argv = server_argv("-odd-dir", 8123, {"seed": -3, "enforce_eager": True})
    ns = _parse(argv)
    assert ns.model == "-odd-dir"
    assert ns.seed == "-3"
    assert ns.enforce_eager is True
    assert ns.port == "8123"
    assert ns.host == "127.0.0.1"
