"""The two ways ``VLLMEngine`` talks to vLLM: an in-process ``vllm.LLM``, or an OpenAI server.

Both expose the same small surface (``complete``, ``prompt_logprobs``, ``rpc``, ``reset_cache``,
``sleep``/``wake_up``, ``close``) so the engine's logic (encoding, checks, weight sync) is written
once. Requests are token ids in and token ids + per-token log-probs out; no text round-trip.

Server mode starts ``python -m vllm.entrypoints.openai.api_server`` bound to 127.0.0.1 with a
random API key (or attaches to a given URL). Weight loading goes through vLLM's dev-mode
``/collective_rpc`` (``VLLM_SERVER_DEV_MODE=1``). vLLM's API key guards only ``/v1/...``, not its
dev endpoints, so the launched server's worker extension additionally checks a random token
(``UNIRL_VLLM_RPC_TOKEN``); on a shared host anyone local can still reach vLLM's own dev
endpoints (sleep, cache reset) on that port — use offline mode there.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from unirl.rollout.engines.vllm_worker import TOKEN_ENV

WORKER_EXTENSION = "unirl.rollout.engines.vllm_worker.UnirlWorkerExtension"
SERVED_NAME = "unirl-policy"
API_KEY_ENV = "VLLM_API_KEY"  # vLLM's server reads its key from here when ``--api-key`` is absent


@dataclass(frozen=True)
class Request:
    """One generation request: prompt ids and vLLM sampling fields (plain JSON values)."""

    prompt_ids: list[int]
    params: dict[str, Any]


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class Backend(Protocol):
    def complete(self, requests: Sequence[Request]) -> list[Completion]: ...
    def prompt_logprobs(self, ids: list[int]) -> list[float]: ...
    def rpc(self, method: str, args: list[Any]) -> list[Any]: ...
    def reset_cache(self) -> None: ...
    def sleep(self, level: int) -> None: ...
    def wake_up(self) -> None: ...
    def close(self) -> None: ...


def engine_kwargs(args: dict[str, Any]) -> dict[str, Any]:
    """Engine arguments every mode shares (the caller's ``args`` win)."""
    base = {
        "generation_config": "vllm",  # no model-specific default stop ids / sampling overrides
        "distributed_executor_backend": "uni",  # one worker inside the engine process (no extra spawn)
        "worker_extension_cls": WORKER_EXTENSION,
    }
    return base | args


def _logprob_of(entry: Any, token: int) -> float:
    if entry is None or token not in entry:
        raise RuntimeError(f"vLLM returned no log-prob for sampled token {token}")
    return float(entry[token].logprob)


class OfflineBackend:
    """``vllm.LLM`` in this process (vLLM runs its engine core in a child process by default)."""

    def __init__(self, model_path: str, args: dict[str, Any]) -> None:
        from vllm import LLM

        self.llm = LLM(model=model_path, **engine_kwargs(args))

    def complete(self, requests: Sequence[Request]) -> list[Completion]:
        from vllm import SamplingParams

        prompts = [{"prompt_token_ids": r.prompt_ids} for r in requests]
        params = [SamplingParams(**r.params) for r in requests]
        outs = self.llm.generate(prompts, params, use_tqdm=False)  # type: ignore[arg-type]
        result = []
        for out in outs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [_logprob_of(e, t) for e, t in zip(o.logprobs or [], ids)]
            result.append(Completion(ids, lps, str(o.finish_reason)))
        return result

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        out = self.llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)[0]  # type: ignore[list-item]
        return [_logprob_of(e, t) for e, t in zip((out.prompt_logprobs or [])[1:], ids[1:])]

    def rpc(self, method: str, args: list[Any]) -> list[Any]:
        return list(self.llm.collective_rpc(method, args=tuple(args)))

    def reset_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def sleep(self, level: int) -> None:
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        self.llm.wake_up()

    def close(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_argv(model_path: str, port: int, args: dict[str, Any]) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server ...`` for ``args`` (engine kwargs).

    Every value is passed as ``--flag=value``: a value that starts with ``-`` (a random token, a
    negative number) would otherwise be read by argparse as the next option. The API key is not
    on the command line at all (``ps`` shows argv to every user): the server reads it from the
    ``VLLM_API_KEY`` environment variable (:data:`API_KEY_ENV`).
    """
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", f"--model={model_path}"]
    argv += ["--host=127.0.0.1", f"--port={port}", f"--served-model-name={SERVED_NAME}"]
    for k, v in engine_kwargs(args).items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            argv += [flag] if v else []
        elif v is not None:
            argv.append(f"{flag}={json.dumps(v) if isinstance(v, dict | list) else v}")
    return argv


class ServerBackend:
    """An OpenAI-compatible vLLM server: launched here (``url=None``) or attached to."""

    def __init__(
        self,
        model_path: str | None,
        args: dict[str, Any],
        *,
        url: str | None = None,
        api_key: str | None = None,
        rpc_token: str | None = None,
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 300.0,
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 120.0,
        max_concurrency: int = 64,
    ) -> None:
        self.request_timeout_s = request_timeout_s
        self.max_concurrency = max_concurrency
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        if url is None:
            if model_path is None:
                raise ValueError("server mode without `url` launches a server and needs the model path")
            self.api_key = api_key or secrets.token_urlsafe(24)
            self.rpc_token: str | None = rpc_token or secrets.token_urlsafe(24)
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            self._launch(server_argv(model_path, port, args), env or {}, startup_timeout_s)
        else:
            self.url = url.rstrip("/")
            self.api_key = api_key or ""
            self.rpc_token = rpc_token
            self._wait_ready(connect_timeout_s, attach=True)

    # ---- process --------------------------------------------------------------------------
    def _launch(self, argv: list[str], env: dict[str, str], timeout_s: float) -> None:
        fd, log = tempfile.mkstemp(prefix="unirl-vllm-server-", suffix=".log")
        self.log_path = Path(log)
        full_env = os.environ | env | {"VLLM_SERVER_DEV_MODE": "1", TOKEN_ENV: str(self.rpc_token)}
        full_env[API_KEY_ENV] = self.api_key
        with os.fdopen(fd, "wb") as out:
            # own process group: close() can reap vLLM's engine processes even if the server died
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
            )
        self._wait_ready(timeout_s, attach=False)

    def log_tail(self, n: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log: attached server)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def _dead(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return (
                f"the vLLM server (pid {self.proc.pid}) exited with code {self.proc.returncode}; "
                f"last log lines ({self.log_path}):\n{self.log_tail()}"
            )
        return None

    def _wait_ready(self, timeout_s: float, *, attach: bool) -> None:
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            dead = self._dead()
            if dead:
                raise RuntimeError(f"vLLM server failed to start: {dead}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2.0) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError) as e:
                last = e
            time.sleep(0.5)  # polling a process we do not control; not a synchronisation sleep
        if not attach:
            self.close()
        what = "no vLLM server answered at" if attach else "the vLLM server did not become healthy at"
        raise TimeoutError(
            f"{what} {self.url}/health within {timeout_s:g}s (last error: {last!r})"
            + ("" if attach else f"; last log lines:\n{self.log_tail()}")
        )

    # ---- HTTP -----------------------------------------------------------------------------
    def _post(self, path: str, body: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        data = json.dumps(body or {}).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method="POST")
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.request_timeout_s) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:2000]
            raise RuntimeError(f"vLLM server {self.url}{path} answered HTTP {e.code}: {detail}") from e
        except (urllib.error.URLError, OSError) as e:
            if self.proc is not None:  # a dropped connection may be the server dying: confirm its exit
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
            dead = self._dead()
            raise RuntimeError(
                f"vLLM server {self.url}{path} failed: {e!r}" + (f"; {dead}" if dead else "")
            ) from e
        return json.loads(raw) if raw else None

    def _complete_one(self, r: Request) -> Completion:
        body = {"model": SERVED_NAME, "prompt": r.prompt_ids, "return_tokens_as_token_ids": True, **r.params}
        out = self._post("/v1/completions", body)
        choice = out["choices"][0]
        lp = choice.get("logprobs") or {}
        tokens = [int(str(t).removeprefix("token_id:")) for t in lp.get("tokens") or []]
        return Completion(
            tokens, [float(x) for x in lp.get("token_logprobs") or []], str(choice["finish_reason"])
        )

    def complete(self, requests: Sequence[Request]) -> list[Completion]:
        if not requests:
            return []
        # one request per sample (each has its own seed); concurrent so vLLM batches them
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
            return list(pool.map(self._complete_one, requests))

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        body = {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
        out = self._post("/v1/completions", body)
        entries = out["choices"][0].get("prompt_logprobs") or out.get("prompt_logprobs") or []
        vals = []
        for e, t in zip(entries[1:], ids[1:]):
            if not e or str(t) not in e:
                raise RuntimeError(f"vLLM server returned no prompt log-prob for token {t}")
            vals.append(float(e[str(t)]["logprob"]))
        return vals

    def rpc(self, method: str, args: list[Any]) -> list[Any]:
        out = self._post("/collective_rpc", {"method": method, "args": [*args, self.rpc_token]})
        return list((out or {}).get("results", []))

    def reset_cache(self) -> None:
        self._post("/reset_prefix_cache")

    def sleep(self, level: int) -> None:
        self._post(f"/sleep?level={level}")

    def wake_up(self) -> None:
        self._post("/wake_up")

    def close(self) -> None:
        """Stop a launched server and whatever is left of its process group (attached: nothing)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        # a server killed abruptly leaves its engine-core child orphaned in the group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
