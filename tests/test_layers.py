"""The dependency rule of DESIGN.md §2, checked on the source tree.

types <- distributed <- rollout <- train <- apps, and types <- reward <- apps.
Both the imports in each package's source and the workspace dependencies it declares must stay
inside what the rule allows, and the apps modules import one another without a cycle. Imports
are every ``import`` / ``from`` statement (also those inside functions: a lazy import that closes a
cycle is still a cycle) and every ``importlib.import_module("...")`` of a literal module name.
Pure AST: runs without installing anything.
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


def _import_module_arg(node: ast.Call) -> str | None:
    """The literal module of ``importlib.import_module("m")`` / ``import_module("m")``, else None."""
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if name != "import_module" or not node.args:
        return None
    arg = node.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def unirl_imports(path: Path, *, names: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every unirl import in ``path``. ``names``: ``from m import a`` also
    yields ``m.a`` (which is the module imported when ``a`` is a submodule)."""
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
                if names:
                    found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call):
            mod = _import_module_arg(node)
            if mod is not None and mod.startswith("unirl"):
                found.append((node.lineno, mod))
    return found


def module_name(py: Path, src: Path) -> str:
    parts = list(py.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(src: Path) -> dict[str, set[str]]:
    """module -> the modules of the same source tree it imports (anywhere in its body)."""
    files = {module_name(py, src): py for py in sorted(src.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for mod, py in files.items():
        graph[mod] = {m for _, m in unirl_imports(py, names=True) if m in files and m != mod}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


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


def test_apps_modules_import_without_a_cycle() -> None:
    assert import_cycles(import_graph(ROOT / "apps/src")) == []


def test_cycle_checker_catches_a_lazy_cycle_and_import_module(tmp_path: Path) -> None:
    """The cycle checker must be able to fail: a function-level import closing a cycle (as
    trainers/base.py <-> distributed/controller.py once did) and an ``import_module`` string."""
    pkg = tmp_path / "unirl" / "apps"
    pkg.mkdir(parents=True)
    (pkg / "base.py").write_text("def run():\n    from unirl.apps.driver import D\n")
    (pkg / "driver.py").write_text("from unirl.apps import base\n")
    (pkg / "cli.py").write_text("import importlib\nimportlib.import_module('unirl.apps.entry')\n")
    (pkg / "entry.py").write_text("from unirl.apps.cli import main\n")
    (pkg / "leaf.py").write_text("import unirl.apps.base\n")
    graph = import_graph(tmp_path)
    assert graph["unirl.apps.cli"] == {"unirl.apps.entry"}
    assert import_cycles(graph) == [
        ["unirl.apps.base", "unirl.apps.driver"],
        ["unirl.apps.cli", "unirl.apps.entry"],
    ]


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
