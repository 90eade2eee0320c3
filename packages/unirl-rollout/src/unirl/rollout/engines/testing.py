"""`WireServer`: a loopback HTTP server that speaks an engine's wire format, for testing HTTP engines.

```python
server = WireServer({"/generate": lambda body: (200, {"text": "..."})})
engine = SGLangLLMEngine(SGLangLLMEngineConfig(url=server.url, ...), ...)
...
server.close()
```
Each route takes the request's JSON body and returns ``(status, json_or_bytes)``; every request is
recorded as ``(path, body, headers)`` in ``calls``. Shipped in the package (not tests/) so the engine
tests of every package, and out-of-tree engines, use the same server.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Route = Callable[[dict[str, Any]], tuple[int, Any]]


class WireServer:
    """A threaded local HTTP server: ``routes[path](json_body) -> (status, json_or_bytes)``."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.calls: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                body = json.loads(raw) if raw else {}
                path = self.path
                server.calls.append((path, body, dict(self.headers)))
                route = server.routes.get(path.split("?")[0])
                status, out = (404, {"detail": f"no route {path}"}) if route is None else route(body)
                data = out if isinstance(out, bytes) else json.dumps(out).encode()
                self.send_response(status)
                self.send_header(
                    "Content-Type",
                    "application/octet-stream" if isinstance(out, bytes) else "application/json",
                )
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # client gave up (timeout)
                    self.wfile.write(data)

            do_GET = do_POST = _serve

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [p for p, _, _ in self.calls]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
