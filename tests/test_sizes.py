"""File and function sizes of the source tree stay under the limits of issue 26.

A source file (every ``packages/*/src/**/*.py`` and ``apps/src/**/*.py``) has at most 400 lines
in all; a function or method, nested ones included, at most 80 lines from its ``def`` to its last
line (decorators not counted). Past these a module or function is a sign to split
(CONVENTIONS.md, "Shape of the code"). Pure AST: runs without installing anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


def source_files(root: Path = ROOT) -> list[Path]:
    files = [p for src in sorted(root.glob("packages/*/src")) for p in src.rglob("*.py")]
    return sorted(files + list((root / "apps/src").rglob("*.py")))


def function_lengths(text: str, filename: str = "<src>") -> list[tuple[str, int]]:
    """(qualified name, lines from ``def`` to the end) of every function and method in ``text``."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                found.append((name, (child.end_lineno or child.lineno) - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(text, filename=filename), "")
    return found


def oversized(path: Path, root: Path = ROOT) -> list[str]:
    """One line per limit that ``path`` breaks: ``file (N lines)`` or ``file:function (N lines)``."""
    text = path.read_text()
    rel = path.relative_to(root)
    bad = []
    n_lines = len(text.splitlines())
    if n_lines > MAX_FILE_LINES:
        bad.append(f"{rel} ({n_lines} lines > {MAX_FILE_LINES})")
    for name, n in function_lengths(text, str(path)):
        if n > MAX_FUNCTION_LINES:
            bad.append(f"{rel}:{name} ({n} lines > {MAX_FUNCTION_LINES})")
    return bad


def test_sources_are_found() -> None:
    files = source_files()
    assert any("unirl-types" in str(p) for p in files)
    assert any(p.is_relative_to(ROOT / "apps/src") for p in files)


def test_files_and_functions_stay_under_the_limits() -> None:
    bad = [line for path in source_files() for line in oversized(path)]
    assert bad == [], "split these:\n" + "\n".join(bad)


def test_checker_catches_a_long_file_and_a_long_nested_method(tmp_path: Path) -> None:
    """The checker itself must be able to fail: a file of 401 lines, and a method of 81 lines
    inside a closure inside a class, are both named; an 80-line function is not."""
    body = "\n".join(["    x = 1"] * 79)
    ok = f"def fine():\n{body}\n"  # 80 lines
    nested = "class C:\n    def outer(self):\n        def inner():\n" + "\n".join(
        ["            y = 2"] * 80
    )  # inner: 81 lines
    path = tmp_path / "m.py"
    path.write_text(ok + nested + "\n" + "\n".join(["z = 3"] * (401 - 80 - 83)) + "\n")
    assert len(path.read_text().splitlines()) == 401
    assert function_lengths(ok) == [("fine", 80)]
    assert oversized(path, tmp_path) == [
        "m.py (401 lines > 400)",
        "m.py:C.outer (82 lines > 80)",
        "m.py:C.outer.inner (81 lines > 80)",
    ]
