"""The server's OpenAPI spec, independent of which scorers a deployment loads."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from unirl.reward.protocol import Modality
from unirl.reward.server.app import create_app
from unirl.reward.server.schema import published_spec


def openapi_spec(modalities: Iterable[Modality] | None = None) -> dict[str, Any]:
    """The spec committed as packages/unirl-reward/openapi.json (a test keeps them equal).

    With `modalities`: the spec a server whose scorers read them serves at GET /openapi.json.
    """
    return published_spec(create_app(lambda: []).state.fastapi_openapi(), modalities)
