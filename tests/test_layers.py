"""The dependency rule of DESIGN.md §2, checked on the source tree.

types <- distributed <- rollout <- train <- apps, and types <- reward <- apps.
Both the imports in each package's source and the workspace dependencies it declares must stay
inside what the rule allows. Pure AST: runs without installing anything.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# layer -> (source root, distribution name, layers it may import)
LAYERS: dict[str, tuple[str, str, set[str]]] = {
    "types": ("packages/unirl-types", "unirl-types", set()),
    "distributed": ("packages/unirl-distributed", "unirl-distributed", {"types"}),
    "rollout": ("packages/unirl-rollout", "unirl-rollout", {"types", "distributed"}),
    "reward": ("packages/unirl-reward", "unirl-reward", {"types"}),
    "train": ("packages/unirl-train", "unirl-train", {"types", "distributed", "rollout"}),
    "apps": ("apps", "unirl-apps", {"types", "distributed", "rollout", "reward", "train"}),
}
DIST_TO_LAYER = {dist: layer for layer, (_, dist, _) in LAYERS.items()}
# Modules of the apps distribution that sit directly in the namespace (thin entry modules).
APPS_TOPLEVEL_PREFIXES = ("train_", "apps")


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "unirl" or len(parts) < 2:
        return None
    head = parts[1]
    if head in LAYERS:
        return head
    if head.startswith(APPS_TOPLEVEL_PREFIXES):
        return "apps"
    return head  # an unknown layer: reported as a violation below


def unirl_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("unirl")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "unirl":
                found += [(node.lineno, f"unirl.{a.name}") for a in node.names]
            elif node.module.startswith("unirl."):
                found.append((node.lineno, node.module))
    return found


def violations(layer: str) -> list[str]:
    root, _, allowed = LAYERS[layer]
    bad = []
    for py in sorted((ROOT / root / "src").rglob("*.py")):
        for lineno, mod in unirl_imports(py):
            target = layer_of(mod)
            if target is None or target == layer:
                continue
            if target not in allowed:
                bad.append(
                    f"{py.relative_to(ROOT)}:{lineno} imports {mod} ({layer} may use {sorted(allowed)})"
                )
    return bad


@pytest.mark.parametrize("layer", list(LAYERS))
def test_imports_follow_the_dependency_rule(layer: str) -> None:
    assert violations(layer) == []


@pytest.mark.parametrize("layer", list(LAYERS))
def test_declared_dependencies_follow_the_dependency_rule(layer: str) -> None:
    root, _, allowed = LAYERS[layer]
    project = tomllib.loads((ROOT / root / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    names = {r.split("[")[0].split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip() for r in reqs}
    declared = {DIST_TO_LAYER[n] for n in names if n in DIST_TO_LAYER} - {layer}  # extras may name self
    assert declared <= allowed, f"{root}/pyproject.toml declares {sorted(declared - allowed)}"


@pytest.mark.parametrize("layer", list(LAYERS))
def test_namespace_package_has_no_init(layer: str) -> None:
    root = LAYERS[layer][0]
    assert not (ROOT / root / "src/unirl/__init__.py").exists(), "unirl.* is a PEP 420 namespace"


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    """The checker itself must be able to fail: a reward module importing unirl.train is caught."""
    src = tmp_path / "bad.py"
    src.write_text(
        "import unirl.types\nfrom unirl.train.stack import TrainStack\nfrom unirl import rollout\n"
    )
    mods = [m for _, m in unirl_imports(src)]
    assert mods == ["unirl.types", "unirl.train.stack", "unirl.rollout"]
    assert [layer_of(m) for m in mods] == ["types", "train", "rollout"]
    assert not {"train", "rollout"} <= LAYERS["reward"][2]
