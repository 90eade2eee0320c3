"""Recipe loading: YAML (OmegaConf: interpolation, `a.b=value` overrides) -> frozen pydantic models.

A typo or an impossible value fails here, before any compute, with the dotted path of the field,
the value received and what is allowed.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

C = TypeVar("C", bound=BaseModel)
Loc = tuple[int | str, ...]
"""A pydantic error location: field names, list indices and union tags."""


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


def format_validation_error(
    err: ValidationError, data: object = None, model: type[BaseModel] | None = None
) -> str:
    """One line per error: the recipe path, what is wrong, the value received and a fix.

    With ``data`` (the validated input) the union tags pydantic puts in its locations
    (``rl.algorithm.grpo.eps_low``) are dropped, so the path is the one a recipe or an override
    writes (``rl.algorithm.eps_low``); with ``model`` an unknown field gets the known ones here."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = _recipe_path(loc, data, missing=e["type"] == "missing") if data is not None else ""
        path = path or ".".join(str(x) for x in loc)
        got = e.get("input")
        ctx = e.get("ctx") or {}
        if e["type"] == "union_tag_invalid":
            got = ctx.get("tag", got)
        shown = repr(got) if not isinstance(got, dict) else "{...}"
        if len(shown) > 80:
            shown = shown[:77] + "..."
        msg = e["msg"]
        if e["type"] == "value_error":
            # a validator's own message names its fields, the value and the fix; the input is the
            # whole section, so showing it adds nothing
            msg = msg.removeprefix("Value error, ")
            lines.append(f"  {path}: {msg}" if path else f"  {msg}")
            continue
        fix = _fix_hint(e["type"], ctx, path, loc, model)
        lines.append(f"  {path}: {msg} (got {shown}); fix: {fix}")
    return "\n".join(lines)


def _recipe_path(loc: Loc, data: object, *, missing: bool) -> str:
    """``loc`` as the recipe path: elements that are not keys of the input are union tags, except
    the last element of a missing field (the field the recipe lacks)."""
    parts: list[str] = []
    node = data
    for i, x in enumerate(loc):
        found, child = _child(node, x)
        if found:
            node = child
        elif isinstance(node, dict) and not (missing and i == len(loc) - 1):
            continue  # a union tag
        else:
            node = None
        parts.append(str(x))
    return ".".join(parts)


def _child(node: object, x: int | str) -> tuple[bool, object]:
    """(whether ``x`` is a key or an index of ``node``, the element there)."""
    if isinstance(node, dict) and x in node:
        return True, node[x]
    if isinstance(node, list | tuple) and isinstance(x, int) and 0 <= x < len(node):
        return True, node[x]
    return False, None


def _fix_hint(
    kind: str, ctx: Mapping[str, object], path: str, loc: Loc, model: type[BaseModel] | None
) -> str:
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()), "?")
        return f"set {path} to a value {bounds[kind]} {limit}"
    if kind == "extra_forbidden":
        known = _fields_at(model, loc[:-1])
        if not known:
            return f"remove {path} (the section has no such field)"
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else f"remove {path}; "
        return hint + f"the fields here are {', '.join(sorted(known))}"
    if kind == "union_tag_invalid":
        return f"set {path}.kind to one of {ctx.get('expected_tags', '?')}"
    if kind == "literal_error":
        return f"set {path} to one of {ctx.get('expected', '?')}"
    if kind == "missing":
        return f"add {path}"
    if kind == "string_pattern_mismatch":
        return f"set {path} to a string matching {ctx.get('pattern', '?')}"
    types = {"int": "a whole number", "float": "a number", "bool": "true or false", "string": "a string"}
    for prefix, what in types.items():
        if kind.startswith(prefix):
            return f"set {path} to {what}"
    if kind in ("tuple_type", "list_type", "set_type"):
        return f"set {path} to a list, e.g. {path}=[a,b]"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"set {path} to a mapping, e.g. {path}={{key: value}}"
    return f"see the description of {path} in the config model"


def _fields_at(model: type[BaseModel] | None, loc: Loc) -> list[str]:
    """Field names of the config model at pydantic location ``loc`` (union tags included), or []."""
    tp: object = model
    for x in loc:
        tp = _step(_unwrap(tp), x)
        if tp is None:
            return []
    tp = _unwrap(tp)
    return list(tp.model_fields) if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def _unwrap(tp: object) -> object:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, UnionType):
        members = [a for a in get_args(tp) if a is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
    return tp


def _step(tp: object, x: int | str) -> object:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(str(x))
        return None if field is None else field.annotation
    origin = get_origin(tp)
    if origin in (Union, UnionType):  # x is the tag: the member whose `kind` admits it
        for member in get_args(tp):
            m = _unwrap(member)
            kind = m.model_fields.get("kind") if isinstance(m, type) and issubclass(m, BaseModel) else None
            if kind is not None and x in get_args(_unwrap(kind.annotation)):
                return m
        return None
    if origin in (list, tuple) and isinstance(x, int):
        return get_args(tp)[0]
    if origin is dict:
        return get_args(tp)[1]
    return None


def validate(model: type[C], data: dict[str, Any], source: str = "recipe") -> C:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RecipeError(f"{source} is invalid:\n{format_validation_error(e, data, model)}") from None


def load(model: type[C], recipe: str, overrides: list[str] | None = None) -> C:
    """Load, override, resolve and validate a recipe into ``model``."""
    return validate(model, load_dict(recipe, overrides), source=f"recipe {recipe!r}")
