"""The pydantic base every schema model uses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict


class SchemaModel(BaseModel):
    """Strict schema model: unknown fields are errors; tensors allowed; bytes are base64 in JSON.

    Models are validated at boundaries (construction from outside data, deserialisation). Code in a
    hot loop that builds them from already-checked values may use ``model_construct``.
    """

    model_config = ConfigDict(
        extra="forbid",
        arbitrary_types_allowed=True,
        ser_json_bytes="base64",
        val_json_bytes="base64",
        ser_json_inf_nan="strings",
        validate_default=False,
    )


def kind_or(default: str) -> Callable[[Any], str]:
    """The discriminator of a ``kind``-tagged config union: the value's ``kind`` (a mapping's key or
    a model's attribute), ``default`` where it names none (a recipe may leave the default kind out,
    e.g. ``rollout.engine.decoder=graph`` alone on the command line)."""

    def kind(value: Any) -> str:
        if isinstance(value, dict):
            return str(value.get("kind", default))
        return str(getattr(value, "kind", default))

    return kind
