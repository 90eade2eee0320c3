"""Run a function on untrusted input in a child process, each call bounded by a wall-clock timeout.

Verification libraries (sympy underneath math-verify) can hang or blow up on adversarial text,
and their own `signal.alarm` timeouts only work in the main thread (not in a server worker).
A child process can always be killed: a call that overruns kills the child, returns the
caller's default, and the next call starts a fresh child. Arguments and results cross the pipe
as JSON text, never pickle.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import multiprocessing as mp
import threading
from multiprocessing.connection import Connection
from typing import Any


def _child(conn: Connection, fn_path: str, preload: tuple[str, ...]) -> None:
    for name in preload:  # heavy imports happen before "ready", outside any call's timeout
        importlib.import_module(name)
    module, _, attr = fn_path.partition(":")
    fn = getattr(importlib.import_module(module), attr)
    conn.send_bytes(b'"ready"')
    while True:
        try:
            args = json.loads(conn.recv_bytes())
        except EOFError:
            return
        try:
            result: Any = {"ok": fn(*args)}
        except Exception as e:  # untrusted input: any failure is reported, never fatal
            result = {"error": f"{type(e).__name__}: {e}"}
        conn.send_bytes(json.dumps(result).encode())


class IsolatedRunner:
    """Calls `fn_path` ("module:function", JSON-serialisable args/result) in one child process.

    `call(args, default)` returns the function's result, or `default` on timeout or error.
    `preload` modules are imported by the child before it reports ready, so the per-call timeout
    never has to cover import time (also after a timeout restarts the child).
    Thread-safe (calls are serialised). `startup_timeout_s` bounds the child's import time.
    """

    def __init__(
        self, fn_path: str, timeout_s: float, startup_timeout_s: float = 60.0, preload: tuple[str, ...] = ()
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.fn_path = fn_path
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.preload = preload
        self._ctx = mp.get_context("spawn")  # fork is unsafe in a threaded server
        self._proc: Any = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self.timeouts = 0

    def _start(self) -> Connection:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_child, args=(child, self.fn_path, self.preload), daemon=True)
        proc.start()
        child.close()
        if not parent.poll(self.startup_timeout_s):
            proc.kill()
            raise RuntimeError(
                f"isolated worker for {self.fn_path} did not start in {self.startup_timeout_s}s"
            )
        parent.recv_bytes()
        self._proc, self._conn = proc, parent
        return parent

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None

    def call(self, args: list[Any], default: Any) -> Any:
        with self._lock:
            conn = self._conn or self._start()
            try:
                conn.send_bytes(json.dumps(args).encode())
                if not conn.poll(self.timeout_s):
                    self.timeouts += 1
                    self._kill()
                    return default
                reply = json.loads(conn.recv_bytes())
            except (EOFError, OSError, BrokenPipeError):  # the child died (e.g. out of memory)
                self._kill()
                return default
            return reply.get("ok", default) if "error" not in reply else default

    def close(self) -> None:
        with self._lock:
            self._kill()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._kill()
