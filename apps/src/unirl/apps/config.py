"""Recipe loading: YAML (OmegaConf: interpolation, `a.b=value` overrides) -> frozen pydantic models.

A typo or an impossible value fails here, before any compute, with the dotted path of the field,
the value received and what is allowed.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

C = TypeVar("C", bound=BaseModel)


class RecipeError(ValueError):
    """A recipe that cannot run: the message names every offending field."""


def shipped_recipes() -> dict[str, Path]:
    """Recipes shipped with unirl-apps, by name (file stem)."""
    root = resources.files("unirl.apps") / "recipes"
    return {Path(str(p)).stem: Path(str(p)) for p in root.iterdir() if str(p).endswith(".yaml")}


def resolve_recipe_path(recipe: str) -> Path:
    """A recipe given as a path, or as the name of a shipped recipe."""
    p = Path(recipe)
    if p.suffix in (".yaml", ".yml"):
        if not p.exists():
            raise RecipeError(f"recipe file {recipe!r} does not exist")
        return p
    shipped = shipped_recipes()
    if recipe not in shipped:
        raise RecipeError(
            f"unknown recipe {recipe!r}; shipped recipes: {sorted(shipped)} (or pass a .yaml path)"
        )
    return shipped[recipe]


def load_dict(recipe: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """The recipe merged with dotted overrides, interpolations resolved, as plain data."""
    path = resolve_recipe_path(recipe)
    try:
        cfg = OmegaConf.load(path)
        if overrides:
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise RecipeError(f"override {bad[0]!r} is not of the form a.b=value")
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise RecipeError(f"recipe {path}: {e}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path} must be a mapping at the top level")
    return {str(k): v for k, v in data.items()}


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        got = e.get("input")
        shown = repr(got) if not isinstance(got, dict) else "{...}"
        if len(shown) > 80:
            shown = shown[:77] + "..."
        lines.append(f"  {loc}: {e['msg']} (got {shown})")
    return "\n".join(lines)


def validate(model: type[C], data: dict[str, Any], source: str = "recipe") -> C:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RecipeError(f"{source} is invalid:\n{format_validation_error(e)}") from None


def load(model: type[C], recipe: str, overrides: list[str] | None = None) -> C:
    """Load, override, resolve and validate a recipe into ``model``."""
    return validate(model, load_dict(recipe, overrides), source=f"recipe {recipe!r}")
