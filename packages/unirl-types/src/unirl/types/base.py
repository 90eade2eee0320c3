"""The pydantic base every schema model uses."""

from __future__ import annotations

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
