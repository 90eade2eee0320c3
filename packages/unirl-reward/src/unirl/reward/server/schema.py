"""The published OpenAPI spec says what the server enforces beyond the pydantic wire models.

- Item inputs. Every field of `WireItem` is optional in the model, but each scorer modality
  reads some of them and a server has at least one scorer. The spec of any deployment (the
  committed openapi.json) requires a response, an image or a video in every item; a running
  server's GET /openapi.json requires exactly the fields its loaded scorers read.
- Union tags. `kind` has a default in each media model, but where a field is a union of them
  (`image`, `video`) the server needs the tag to pick the model: the spec requires it there.
- Encoded image bytes. The model needs at least one byte, a bound its base64 JSON schema drops;
  the spec asks for at least 4 characters, the shortest base64 text of one byte.
- Error bodies. Every 4xx/5xx is JSON (`ErrorResponse`, or `HealthResponse` for /ready) on
  every path, /metrics included: FastAPI would otherwise declare the errors of a text/plain
  route as text/plain, which the server never sends.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, get_args

from unirl.reward.protocol import Modality, required_inputs

JSON = "application/json"


def published_spec(spec: dict[str, Any], modalities: Iterable[Modality] | None = None) -> dict[str, Any]:
    """A copy of FastAPI's `spec`, adjusted as the module docstring says.

    `modalities` are those of a running server's scorers; None (not loaded, or the committed spec)
    gives the rule every deployment enforces.
    """
    spec = copy.deepcopy(spec)
    item = spec["components"]["schemas"]["WireItem"]
    if modalities is None:
        _require_any_modality(item)
    else:
        _require_fields(item, sorted({f for m in modalities for f in required_inputs(m)}))
    _require_tags(spec)
    spec["components"]["schemas"]["EncodedImage"]["properties"]["data"]["minLength"] = 4
    _errors_are_json(spec)
    return spec


def _require_any_modality(item: dict[str, Any]) -> None:
    needs = {required_inputs(m) for m in get_args(Modality)}
    # the minimal sets: ("image", "prompt") adds nothing to the alternative ("image",)
    minimal = sorted(n for n in needs if not any(set(o) < set(n) for o in needs))
    props = item["properties"]
    item["anyOf"] = [
        {"required": list(n), "properties": {f: _non_null(props[f]) for f in n}} for n in minimal
    ]
    fields = ", ".join(f"`{n[0]}`" if len(n) == 1 else "+".join(n) for n in minimal)
    item["description"] += (
        f"\n\nEvery item carries one of {fields}: each scorer reads one. Which fields this server's "
        "scorers read, and so require, is in its GET /openapi.json."
    )


def _require_fields(item: dict[str, Any], fields: list[str]) -> None:
    item["required"] = fields
    for f in fields:
        prop = item["properties"][f]
        item["properties"][f] = {**_non_null(prop), **({"title": prop["title"]} if "title" in prop else {})}
    item["description"] += f"\n\nThis server's scorers read, and so require: {', '.join(fields)}."


def _non_null(prop: dict[str, Any]) -> dict[str, Any]:
    """`prop` (an optional field's `anyOf: [..., {"type": "null"}]`) without the null branch."""
    if "anyOf" not in prop:
        return {k: v for k, v in prop.items() if k != "title"}
    branches = [b for b in prop["anyOf"] if b != {"type": "null"}]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _require_tags(node: Any) -> None:
    """Next to every `discriminator`, require its property (the members' own schemas need not)."""
    if isinstance(node, dict):
        if "discriminator" in node:
            node["required"] = [node["discriminator"]["propertyName"]]
        for child in node.values():
            _require_tags(child)
    elif isinstance(node, list):
        for child in node:
            _require_tags(child)


def _errors_are_json(spec: dict[str, Any]) -> None:
    for operations in spec["paths"].values():
        for op in operations.values():
            for status, response in op.get("responses", {}).items():
                content = response.get("content")
                if int(status) >= 400 and content and JSON not in content:
                    response["content"] = {JSON: next(iter(content.values()))}
