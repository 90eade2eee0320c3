"""Checks of a user's diffusers checkpoint before it is loaded: clear errors, not a stack trace.

A local folder is checked against its ``model_index.json`` (the diffusers layout): it must exist,
name a pipeline of the family the bundle loads (a FLUX folder handed to the Qwen-Image bundle says
so and names the ``model.kind`` that loads it), and hold every component folder the family needs.
A hub id (``org/name``, no such local path) is passed through to ``from_pretrained`` unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

__all__ = ["PIPELINE_KINDS", "check_diffusers_dir"]

PIPELINE_KINDS: dict[str, str] = {
    "StableDiffusion3Pipeline": "sd3",
    "FluxPipeline": "flux",
    "QwenImagePipeline": "qwen_image",
    "Flux2KleinPipeline": "flux2_klein",
    "ZImagePipeline": "z_image",
}
"""diffusers pipeline class -> the recipe ``model.kind`` whose bundle loads it."""


def _looks_local(path: str) -> bool:
    return path.startswith(("/", ".", "~")) or path.count("/") != 1 or Path(path).exists()


def check_diffusers_dir(path: str, pipeline_classes: Sequence[str], components: Sequence[str]) -> None:
    """Raise a ValueError / FileNotFoundError naming the problem and the fix, or return.

    Args:
        path: a local diffusers folder or a hub id (hub ids are not checked here).
        pipeline_classes: ``_class_name`` values this bundle accepts.
        components: the ``model_index.json`` entries (and folders) the bundle needs.
    """
    if not _looks_local(path):
        return
    root = Path(path).expanduser()
    family = pipeline_classes[0]
    if not root.exists():
        raise FileNotFoundError(
            f"model.path={path!r} does not exist; fix: point model.path at a local diffusers folder "
            f"(the one holding model_index.json of a {family}) or at a hub id such as 'org/name'"
        )
    index = root / "model_index.json"
    if not index.is_file():
        raise FileNotFoundError(
            f"model.path={path!r} has no model_index.json, so it is not a diffusers pipeline folder; fix: "
            f"save the model with {family}.save_pretrained(dir) or point at the folder that has it"
        )
    meta = json.loads(index.read_text())
    cls = meta.get("_class_name")
    if cls not in pipeline_classes:
        kind = PIPELINE_KINDS.get(str(cls))
        hint = f"set model.kind={kind!r} to load it" if kind else "load it with its own pipeline class"
        raise ValueError(
            f"model.path={path!r} is a {cls} checkpoint, not {' / '.join(pipeline_classes)} "
            f"(model_index.json _class_name); fix: {hint}, or point model.path at a {family} folder"
        )
    for name in components:
        entry = meta.get(name)
        if not isinstance(entry, list) or entry[0] is None or not (root / name).is_dir():
            raise ValueError(
                f"model.path={path!r} is missing the {name!r} component of {cls} (model_index.json "
                f"entry {entry!r}, folder {name}/ {'present' if (root / name).is_dir() else 'absent'}); fix: "
                f"copy the full pipeline (every folder model_index.json lists) or save it again with "
                f"{cls}.save_pretrained"
            )
