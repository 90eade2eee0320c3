"""`unirl-reward serve --config scorers.yaml [--host H] [--port P]` and `unirl-reward openapi`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from unirl.reward.server.app import create_app
    from unirl.reward.server.settings import ServeConfig, check_bind

    try:
        cfg = ServeConfig.from_yaml(args.config)
    except (OSError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        print(f"unirl-reward: {args.config}: {_config_error(e)}", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    settings = cfg.server.model_copy(update=overrides)
    token = os.environ.get(settings.token_env) or None
    try:
        check_bind(settings.host, token)
    except ValueError as e:
        print(f"unirl-reward: {e}", file=sys.stderr)
        return 2
    app = create_app(cfg.build, settings, token)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=args.log_level)
    server = uvicorn.Server(config)
    if args.port_file:
        _write_port_when_started(server, Path(args.port_file))
    server.run()
    return 0


def _config_error(e: Exception) -> str:
    """One line per problem: the config path, what was wrong, and (for a bad `kind`) the options."""
    from pydantic import ValidationError

    if not isinstance(e, ValidationError):
        return str(e)
    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        ctx = err.get("ctx") or {}
        if err["type"] == "union_tag_invalid":
            lines.append(
                f"{loc}.{ctx['discriminator'].strip(chr(39))}: unknown scorer kind {ctx['tag']!r}; "
                f"choose one of {ctx['expected_tags']}"
            )
        else:
            lines.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
    return "invalid config:\n  " + "\n  ".join(lines)


def _write_port_when_started(server: object, path: Path) -> None:
    """With --port 0, write the bound port to `path` once listening (tests and scripts read it)."""
    import uvicorn

    assert isinstance(server, uvicorn.Server)
    original = server.startup

    async def startup(sockets: object = None) -> None:
        await original(sockets)  # type: ignore[arg-type]
        for s in server.servers:
            for sock in s.sockets:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(str(sock.getsockname()[1]))
                tmp.replace(path)
                return

    server.startup = startup  # type: ignore[method-assign]


def _openapi(args: argparse.Namespace) -> int:
    from unirl.reward.server.openapi import openapi_spec

    text = json.dumps(openapi_spec(), indent=2, sort_keys=True) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="unirl-reward", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="run the reward HTTP server")
    serve.add_argument("--config", required=True, help="YAML with `scorers:` and optional `server:`")
    serve.add_argument("--host", default=None, help="override server.host")
    serve.add_argument("--port", type=int, default=None, help="override server.port (0 = any free port)")
    serve.add_argument("--port-file", default=None, help="write the bound port here once listening")
    serve.add_argument("--log-level", default="warning")
    serve.set_defaults(fn=_serve)
    spec = sub.add_parser("openapi", help="print the OpenAPI spec of the server")
    spec.add_argument("--output", default=None)
    spec.set_defaults(fn=_openapi)
    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    raise SystemExit(main())
