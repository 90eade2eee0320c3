"""Lazy imports of optional dependencies with a message naming the extra that installs them."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError):
    """An optional dependency of a model scorer is not installed."""


def require(extra: str, module: str) -> ModuleType:
    """Import `module` or raise MissingExtraError with the pip command for `extra`."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(
            f"this scorer needs {module!r}, which is not installed: pip install 'unirl-reward[{extra}]' "
            f"(or 'unirl-reward[models]' for every model scorer); import error: {e}"
        ) from e
