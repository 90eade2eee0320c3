"""Atomic training checkpoints: backend state + per-rank RNG + caller extras, no pickle on load.

Two formats, chosen at save time (``format=``) and recognised at load time from ``meta.json``:

``full`` (default): the full state gathered on rank 0::

    meta.json        format version, global step, world size
    state.pt         backend.state_dict() (full, CPU; written by rank 0)
    rng-<rank>.pt    torch / CUDA / numpy / python RNG states of each rank
    extra.json       the caller's JSON-serialisable extra state (data cursor, weight version, ...)
    files/<name>     the caller's extra files (bytes it encoded itself, e.g. buffered Samples)

  Loaded with `torch.load(weights_only=True)` (a restricted unpickler: tensors and plain
  containers only) and `json`; resumable only with the same world size.

``sharded``: every rank writes its own shards as safetensors, JSON holds the rest; nothing is
  pickled at all, and a run with another world size can resume from it (see
  :mod:`unirl.train.sharded_checkpoint`). No rank ever holds the full state.

Both are written into `<dir>.tmp-<step>` and renamed onto `<dir>` once every rank's files and, last,
`meta.json` are written (an existing checkpoint at `<dir>` is moved aside and deleted after), so a
crash never leaves a half-written checkpoint at `<dir>`; :func:`latest_complete` also recovers
the one window where `<dir>` is briefly absent. Multi-rank runs need a filesystem shared by the ranks.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
import torch.distributed as dist

from unirl.train import sharded_checkpoint as sharded
from unirl.types.faults import fault_point

FORMAT_VERSION = 1
SHARDED_FORMAT_VERSION = 2
CheckpointFormat = Literal["full", "sharded"]


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


class Checkpointable(Protocol):
    """What a checkpoint reads and restores of its target: every ``TrainBackend`` has it (so does
    the PE trainer's pair of stacks saved as one). ``format="sharded"`` also needs
    ``sharded_state_dict`` / ``load_sharded_state_dict`` (FSDPBackend)."""

    @property
    def global_step(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def save_checkpoint(
    directory: str | os.PathLike[str],
    backend: Checkpointable,
    extra: dict[str, Any] | None = None,
    *,
    format: CheckpointFormat = "full",
    files: dict[str, bytes] | None = None,
) -> Path:
    """Write a checkpoint of `backend` (+ RNG, + `extra`) atomically to `directory` (collective).

    ``format="sharded"`` needs a backend with ``sharded_state_dict`` (FSDPBackend). ``files``
    (rank 0's): extra files saved in the same atomic checkpoint, read back with
    :func:`read_checkpoint_file`; their bytes are never unpickled here."""
    if format not in ("full", "sharded"):
        raise ValueError(f"checkpoint format={format!r} is not one of 'full', 'sharded'")
    final = Path(directory)
    extra = dict(extra or {})
    try:
        extra_text = json.dumps(extra, sort_keys=True)
    except TypeError as e:
        raise TypeError(
            f"save_checkpoint extra must be JSON-serialisable (ints, floats, strings, lists, dicts): {e}"
        ) from e
    for name in files or {}:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"checkpoint file name {name!r} must be a plain file name")
    tmp = final.with_name(f"{final.name}.tmp-{backend.global_step}")
    if format == "sharded":
        return _save_sharded(final, tmp, backend, extra_text, files or {})
    state = backend.state_dict()  # collective: every rank takes part
    rank = backend.rank
    _make_tmp(tmp, final, backend)
    error: OSError | None = None
    try:
        torch.save(capture_rng_state(), tmp / f"rng-{rank}.pt")
        if rank == 0:
            torch.save(state, tmp / "state.pt")
            (tmp / "extra.json").write_text(extra_text)
            _write_files(tmp, files or {})
            meta = {
                "format_version": FORMAT_VERSION,
                "global_step": backend.global_step,
                "world_size": backend.world_size,
            }
            (tmp / "meta.json").write_text(json.dumps(meta))
    except OSError as e:
        error = e
    _all_wrote(error, final, tmp, backend)
    fault_point("ckpt_write", backend.global_step)
    try:
        if rank == 0:
            _replace_dir(tmp, final, backend.global_step)
    except OSError as e:
        error = e
    _all_wrote(error, final, tmp, backend)
    return final


def _all_wrote(error: OSError | None, final: Path, tmp: Path, backend: Checkpointable) -> None:
    """Collective: return when every rank's writes succeeded; else every rank raises (none hangs
    in a barrier), rank 0 after deleting the unfinished `tmp` (a full disk gets its space back)."""
    if sharded.all_ok(error is None, backend.world_size):
        return
    if backend.rank == 0 and read_meta(tmp) is None:
        shutil.rmtree(tmp, ignore_errors=True)
    if error is not None:
        raise save_error(error, final) from error
    raise RuntimeError(f"checkpoint save to {final} failed on another rank (see its error); nothing replaced")


_WHY = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "no permission to write there",
    errno.EPERM: "no permission to write there",
}


def save_error(error: OSError, final: Path) -> OSError:
    """The OSError a failed save raises: what failed, what is left, what to do (errno kept)."""
    prev = latest_complete(final)
    meta = read_meta(prev) if prev is not None else None
    kept = (
        f"the last complete checkpoint, {prev} (global step {meta['global_step']}), is intact and is what "
        "a resume loads"
        if prev is not None and meta is not None
        else f"there was no previous checkpoint at {final}"
    )
    why = _WHY.get(error.errno or 0, error.strerror or type(error).__name__)
    return OSError(
        error.errno,
        f"checkpoint save to {final} failed: {why} ({error}); nothing half-written is left and {kept}. "
        f"Free space on (or make writable) {final.parent}, or give the run another directory, then save "
        "or resume again",
    )


def _make_tmp(tmp: Path, final: Path, backend: Checkpointable) -> None:
    """Rank 0 makes a fresh `tmp`; every rank raises if it could not (also the barrier after it)."""
    made: OSError | None = None
    try:
        if backend.rank == 0:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
    except OSError as e:
        made = e
    _all_wrote(made, final, tmp, backend)


def _write_files(tmp: Path, files: dict[str, bytes]) -> None:
    if files:
        (tmp / "files").mkdir()
    for name, data in files.items():
        (tmp / "files" / name).write_bytes(data)


def read_checkpoint_file(directory: str | os.PathLike[str], name: str) -> bytes | None:
    """An extra file saved with ``save_checkpoint(files=...)``, or None if it has none by that name."""
    path = Path(directory) / "files" / name
    return path.read_bytes() if path.is_file() else None


def _save_sharded(
    final: Path, tmp: Path, backend: Checkpointable, extra_text: str, files: dict[str, bytes]
) -> Path:
    state_fn = getattr(backend, "sharded_state_dict", None)
    if state_fn is None:
        raise ValueError(
            f"checkpoint format='sharded' needs a backend with sharded_state_dict(); "
            f"{type(backend).__name__} has none: use format='full'"
        )
    rank, world = backend.rank, backend.world_size
    _make_tmp(tmp, final, backend)
    try:
        index = sharded.write_shards(tmp, state_fn(), rank, world)  # collective; raises on every rank
    except OSError as e:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise save_error(e, final) from e
    error: Exception | None = None
    if rank == 0:
        try:
            (tmp / "index.json").write_text(json.dumps(index))
            (tmp / "extra.json").write_text(extra_text)
            _write_files(tmp, files)
            meta = {
                "format_version": SHARDED_FORMAT_VERSION,
                "format": "sharded",
                "global_step": backend.global_step,
                "world_size": world,
                "files": sharded.manifest(tmp, world),
            }
            (tmp / "meta.json").write_text(json.dumps(meta))  # last: its manifest marks completeness
            fault_point("ckpt_write", backend.global_step)
            _replace_dir(tmp, final, backend.global_step)
        except Exception as e:  # re-raised below once the other ranks know
            error = e
    if not sharded.all_ok(error is None, world):
        if rank == 0 and read_meta(tmp) is None:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, OSError):
            raise save_error(error, final) from error
        if error is not None:
            raise error
        raise RuntimeError(f"sharded checkpoint: rank 0 failed to finish {tmp}")
    return final


def read_meta(path: Path) -> dict[str, Any] | None:
    """The checkpoint's meta.json when the checkpoint at `path` is complete, else None.

    Complete: meta.json parses; a sharded checkpoint's manifest matches the files on disk (a
    truncated or partially copied directory is not a checkpoint); a full one has its state file."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    if meta.get("format") == "sharded":
        return meta if sharded.is_complete(path, meta) is None else None
    return meta if (path / "state.pt").is_file() and (path / "extra.json").is_file() else None


def latest_complete(directory: str | os.PathLike[str]) -> Path | None:
    """The checkpoint to resume from for the checkpoint slot `directory` (e.g. `checkpoints/latest`).

    `directory` itself when complete. Otherwise a save was interrupted between moving the old
    checkpoint aside and renaming the new one into place: the complete candidate (`<dir>.old` or a
    finished `<dir>.tmp-<step>`) with the highest global step is returned. None when there is none.
    """
    final = Path(directory)
    if read_meta(final) is not None:
        return final
    best: tuple[int, Path] | None = None
    for cand in [final.with_name(f"{final.name}.old"), *final.parent.glob(f"{final.name}.tmp-*")]:
        meta = read_meta(cand)
        if meta is not None and (best is None or int(meta["global_step"]) > best[0]):
            best = (int(meta["global_step"]), cand)
    return best[1] if best is not None else None


def load_checkpoint(directory: str | os.PathLike[str], backend: Checkpointable) -> dict[str, Any]:
    """Restore `backend` and this rank's RNG from `directory`; returns the caller's extra state."""
    path = Path(directory)
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (missing meta.json)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") == "sharded":
        return _load_sharded(path, meta, backend)
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


def _load_sharded(path: Path, meta: dict[str, Any], backend: Checkpointable) -> dict[str, Any]:
    if meta.get("format_version") != SHARDED_FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {path} has format_version={meta.get('format_version')}, expected "
            f"{SHARDED_FORMAT_VERSION} for a sharded checkpoint"
        )
    problem = sharded.is_complete(path, meta)
    if problem is not None:
        raise ValueError(f"checkpoint {path} is incomplete: {problem}")
    state_fn = getattr(backend, "sharded_state_dict", None)
    load_fn = getattr(backend, "load_sharded_state_dict", None)
    if state_fn is None or load_fn is None:
        raise ValueError(f"{path} is a sharded checkpoint; {type(backend).__name__} cannot load one")
    state = sharded.read_state(path, state_fn(), backend.rank, backend.world_size, int(meta["world_size"]))
    load_fn(state)
    _barrier(backend)
    return json.loads((path / "extra.json").read_text())


def _replace_dir(src: Path, dst: Path, step: int) -> None:
    """Move `src` onto `dst`; an existing `dst` is moved aside first and deleted after, as are
    the leftovers of interrupted saves (`<dst>.tmp-*`) once the new checkpoint is in place."""
    old = dst.with_name(f"{dst.name}.old")
    if dst.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(dst, old)
    fault_point("ckpt_swap", step)  # a kill here leaves only `<dst>.old` and `src`: both complete
    os.replace(src, dst)
    if old.exists():
        shutil.rmtree(old)
    for stale in dst.parent.glob(f"{dst.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _barrier(backend: Checkpointable) -> None:
    if backend.world_size > 1:
        dist.barrier()
