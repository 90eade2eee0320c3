"""JSON request bodies without NaN or infinities.

Python's json module reads the non-standard literals NaN, Infinity and -Infinity, and an
overflowing literal such as 1e999, as non-finite floats, and pydantic lets them through any
plain `float` (item metadata is one). The server refuses them anywhere in a body with a 422
naming the field path. The check rides on the parser's own hooks, so a valid body costs one
Python call per float literal and no extra walk; only a refused body is parsed a second time,
to find the path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

Loc = tuple[str | int, ...]


class NonFiniteNumber(ValueError):
    """A body holds a number JSON cannot represent; `loc` is its path, "body" first."""

    def __init__(self, loc: Loc, literal: str) -> None:
        self.loc, self.literal = loc, literal
        path = ".".join(str(p) for p in loc)
        super().__init__(
            f"{path}: Input should be a finite number (got {literal}); JSON has no NaN or infinity"
        )


class _Refused(Exception):
    """Raised from the parser hooks to stop at the first non-finite literal."""


def _refuse_constant(literal: str) -> float:
    raise _Refused(literal)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):  # an overflowing literal; NaN and Infinity arrive as constants
        raise _Refused(literal)
    return value


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its key/value pairs, so a duplicate key does not hide an earlier value."""


def loads_finite(body: bytes | str) -> Any:
    """`json.loads`, but NonFiniteNumber for NaN, +-Infinity or an overflowing number anywhere."""
    try:
        return json.loads(body, parse_float=_finite_float, parse_constant=_refuse_constant)
    except _Refused as refused:
        tree = json.loads(body, object_pairs_hook=_Pairs)
        raise NonFiniteNumber(("body", *_first_non_finite(tree)), refused.args[0]) from None


def _first_non_finite(node: Any) -> Loc:
    """The path to the first non-finite float in `node` (parsed with `_Pairs` objects)."""
    children: list[tuple[str | int, Any]]
    if isinstance(node, _Pairs):
        children = list(node)
    elif isinstance(node, list):
        children = list(enumerate(node))
    else:
        return ()
    for key, child in children:
        if isinstance(child, float) and not math.isfinite(child):
            return (key,)
        if isinstance(child, list):  # _Pairs is a list too
            found = _first_non_finite(child)
            if found:
                return (key, *found)
    return ()


class FiniteJSONRequest(Request):
    """A request whose `json()` refuses non-finite numbers with a 422 naming the field path."""

    async def json(self) -> Any:
        try:
            return loads_finite(await self.body())
        except NonFiniteNumber as e:
            # An HTTPException: FastAPI re-raises it from body parsing (any other error is a 400).
            raise HTTPException(422, f"invalid request: {e}") from None


class FiniteJSONRoute(APIRoute):
    """An APIRoute that parses JSON bodies with `FiniteJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def finite_handler(request: Request) -> Response:
            return await handler(FiniteJSONRequest(request.scope, request.receive))

        return finite_handler
