"""Atomic training checkpoints: backend state + per-rank RNG + caller extras, no pickle on load.

Layout of a checkpoint directory:
    meta.json        format version, global step, world size
    state.pt         backend.state_dict() (full, CPU; written by rank 0)
    rng-<rank>.pt    torch / CUDA / numpy / python RNG states of each rank
    extra.json       the caller's JSON-serialisable extra state (data cursor, weight version, ...)
Everything is written into `<dir>.tmp-<step>` and then renamed onto `<dir>` (an existing
checkpoint at `<dir>` is replaced), so a crash never leaves a half-written checkpoint at
`<dir>`. Loading uses `torch.load(weights_only=True)` and `json`, never unrestricted pickle.
Multi-rank runs need a filesystem shared by the ranks.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from unirl.train.backends.base import TrainBackend

FORMAT_VERSION = 1


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors / ints only (loadable with weights_only=True)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, py_state, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": version, "state": list(py_state), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    directory: str | os.PathLike[str], backend: TrainBackend, extra: dict[str, Any] | None = None
) -> Path:
    """Write a checkpoint of `backend` (+ RNG, + `extra`) atomically to `directory` (collective)."""
    final = Path(directory)
    extra = dict(extra or {})
    try:
        extra_text = json.dumps(extra, sort_keys=True)
    except TypeError as e:
        raise TypeError(
            f"save_checkpoint extra must be JSON-serialisable (ints, floats, strings, lists, dicts): {e}"
        ) from e
    tmp = final.with_name(f"{final.name}.tmp-{backend.global_step}")
    state = backend.state_dict()  # collective: every rank takes part
    rank = backend.rank
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    _barrier(backend)
    torch.save(capture_rng_state(), tmp / f"rng-{rank}.pt")
    if rank == 0:
        torch.save(state, tmp / "state.pt")
        (tmp / "extra.json").write_text(extra_text)
        meta = {
            "format_version": FORMAT_VERSION,
            "global_step": backend.global_step,
            "world_size": backend.world_size,
        }
        (tmp / "meta.json").write_text(json.dumps(meta))
    _barrier(backend)
    if rank == 0:
        _replace_dir(tmp, final)
    _barrier(backend)
    return final


def load_checkpoint(directory: str | os.PathLike[str], backend: TrainBackend) -> dict[str, Any]:
    """Restore `backend` and this rank's RNG from `directory`; returns the caller's extra state."""
    path = Path(directory)
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (missing meta.json)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {path} has format_version={meta.get('format_version')}, expected {FORMAT_VERSION}"
        )
    if meta["world_size"] != backend.world_size:
        raise ValueError(
            f"checkpoint {path} was written by {meta['world_size']} ranks, this run has {backend.world_size}; "
            "resuming on another world size is not supported yet"
        )
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    backend.load_state_dict(state)
    restore_rng_state(torch.load(path / f"rng-{backend.rank}.pt", weights_only=True))
    return json.loads((path / "extra.json").read_text())


def _replace_dir(src: Path, dst: Path) -> None:
    """Move `src` onto `dst`; an existing `dst` is moved aside first and deleted after."""
    old = dst.with_name(f"{dst.name}.old")
    if dst.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(dst, old)
    os.replace(src, dst)
    if old.exists():
        shutil.rmtree(old)


def _barrier(backend: TrainBackend) -> None:
    if backend.world_size > 1:
        dist.barrier()
