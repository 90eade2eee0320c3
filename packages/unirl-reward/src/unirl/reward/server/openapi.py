"""The server's OpenAPI spec, independent of which scorers a deployment loads."""

from __future__ import annotations

from typing import Any

from unirl.reward.server.app import create_app


def openapi_spec() -> dict[str, Any]:
    """The spec committed as packages/unirl-reward/openapi.json (a test keeps them equal)."""
    return create_app(lambda: []).openapi()
