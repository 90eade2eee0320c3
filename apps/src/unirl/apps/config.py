"""Recipe loading: YAML (OmegaConf: interpolation, `a.b=value` overrides) -> frozen pydantic models.

A typo or an impossible value fails here, before any compute, with the dotted path of the field,
the value received and what is allowed.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf
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
        cfg = _load_with_base(path, ())
        if overrides:
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise RecipeError(f"override {bad[0]!r} is not of the form a.b=value")
            cfg = _merge_over(cfg, OmegaConf.from_dotlist(overrides))
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise RecipeError(f"recipe {path}: {e}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path} must be a mapping at the top level")
    return {str(k): v for k, v in data.items()}


def _load_with_base(path: Path, chain: tuple[Path, ...]) -> DictConfig:
    """One recipe file; a top-level `base: NAME` (a shipped recipe, or a .yaml path relative to
    this file) loads that recipe first and this file's keys are merged over it, node by node."""
    if path.resolve() in chain:
        names = " -> ".join(p.name for p in (*chain, path.resolve()))
        raise RecipeError(f"recipe {path}: `base` chain loops ({names})")
    cfg = OmegaConf.load(path)
    if not isinstance(cfg, DictConfig):
        raise RecipeError(f"recipe {path} must be a mapping at the top level")
    if "base" not in cfg:
        return cfg
    base = str(cfg.pop("base"))
    if base.endswith((".yaml", ".yml")):
        base = str(path.parent / base)
    return _merge_over(_load_with_base(resolve_recipe_path(base), (*chain, path.resolve())), cfg)


def _merge_over(base: DictConfig, extra: DictConfig, path: str = "") -> DictConfig:
    """`extra` merged over `base` (a `base:` file or the overrides), nodes of a new kind replaced."""
    _drop_replaced_kinds(base, extra, path)
    merged = OmegaConf.merge(base, extra)
    assert isinstance(merged, DictConfig)
    return merged


def _drop_replaced_kinds(base: DictConfig, extra: DictConfig, path: str = "") -> None:
    """Where an override gives a node another `kind`, the recipe's node is dropped, not merged.

    `rl.algorithm.kind=diffusion_nft` then starts that node from the override's keys alone instead
    of keeping the recipe's FlowGRPO fields (which the strict config would reject as unknown).
    An override into a list element (`reward.scorers.0.weight=2`) reaches here as a mapping keyed
    by the index; it is merged into that element, which becomes the override's list.
    """
    for key, value in list(extra.items()):
        old = base.get(key) if isinstance(base, DictConfig) else None
        where = f"{path}{key}"
        if isinstance(old, ListConfig) and isinstance(value, DictConfig):
            extra[key] = _merge_into_list(old, value, where)
        elif not (isinstance(value, DictConfig) and isinstance(old, DictConfig)):
            continue
        elif "kind" in value and old.get("kind") != value.get("kind"):
            del base[key]
        else:
            _drop_replaced_kinds(old, value, f"{where}.")


def _merge_into_list(old: ListConfig, by_index: DictConfig, where: str) -> ListConfig:
    """A copy of the list ``old`` (at ``where``) with each ``by_index`` entry merged into the
    element it indexes; an element given another `kind` is replaced, as a mapping node is."""
    out = OmegaConf.create(OmegaConf.to_container(old, resolve=False))
    assert isinstance(out, ListConfig)
    for key, value in by_index.items():
        k = str(key)
        if not k.isdigit() or int(k) >= len(out):
            allowed = f"0..{len(out) - 1}" if len(out) else "none: the list is empty"
            raise RecipeError(
                f"override {where}.{k}: {where} is a list of {len(out)} element(s), index {k!r} is not "
                f"one of its indices ({allowed}); to add or remove elements, give the whole list: "
                f"{where}=[...]"
            )
        elem = out[int(k)]
        if isinstance(elem, DictConfig) and isinstance(value, DictConfig):
            if "kind" in value and elem.get("kind") != value.get("kind"):
                out[int(k)] = value
            else:
                out[int(k)] = _merge_over(elem, value, f"{where}.{k}.")
        else:
            out[int(k)] = value
    return out


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
