"""Run the app on real uvicorn in a background thread (tests, notebooks, embedding in a trainer)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

import uvicorn

from unirl.reward.server.settings import check_bind


@dataclass
class ServerHandle:
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise RuntimeError(f"reward server thread did not stop within {timeout_s}s")

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(
    app: Any, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 60.0, wait_ready: bool = True
) -> ServerHandle:
    """Start uvicorn on `host:port` (0 = a free port); returns once it listens and, with
    `wait_ready`, once the app's scorers have loaded (a load failure raises RuntimeError).

    Waits on an Event set by uvicorn's startup (bounded by `timeout_s`), never on sleeps.
    ValueError, before binding, for a host beyond loopback when the app has no token.
    """
    check_bind(host, "set" if getattr(getattr(app, "state", None), "has_token", False) else None)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    started = threading.Event()
    bound: list[int] = []
    original = server.startup

    async def startup(sockets: Any = None) -> None:
        try:
            await original(sockets)
            for s in server.servers:
                bound.extend(sock.getsockname()[1] for sock in s.sockets)
        finally:
            started.set()

    server.startup = startup  # type: ignore[method-assign]
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve()), daemon=True, name="unirl-reward-server"
    )
    thread.start()
    if not started.wait(timeout_s) or not bound:
        server.should_exit = True
        thread.join(5)
        raise RuntimeError(f"reward server did not start on {host}:{port} within {timeout_s}s (see log)")
    handle = ServerHandle(f"http://{host}:{bound[0]}", server, thread)
    loaded = getattr(getattr(app, "state", None), "loaded", None)
    if wait_ready and loaded is not None:
        error = None
        if not loaded.wait(timeout_s):
            error = f"reward server scorers did not load within {timeout_s}s"
        elif app.state.load_state["load_error"]:
            error = f"reward server scorers failed to load: {app.state.load_state['load_error']}"
        if error:
            handle.stop()
            raise RuntimeError(error)
    return handle
