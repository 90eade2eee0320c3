"""Sharded checkpoints: every rank writes its own DTensor shards as safetensors; JSON holds the rest.

Layout of a sharded checkpoint directory (``meta.json["format"] == "sharded"``)::

    rank-00000.safetensors   this rank's pieces: the local dim-0 shard of every sharded tensor
                             (model, optimizer moments, EMA), the full value of replicated / plain
                             tensors (rank 0 only), and the rank's RNG tensors (``rng/...``); the
                             safetensors header metadata holds the rank's scalar RNG state as JSON
    rank-00001.safetensors   ...
    index.json               the state tree as JSON (tensors replaced by references) and, per
                             tensor, its global shape, dtype and which rank holds which rows
    extra.json               the caller's JSON extra state (data cursor, weight version, ...)
    meta.json                format, global step, world size and a manifest (every file's size);
                             written last: a directory without a valid manifest is incomplete

Nothing here is unpickled: safetensors (a JSON header + raw bytes) and JSON are the only formats,
so a checkpoint is data, never code, wherever it came from.

Resharding: FSDP2 shards every parameter (and so its optimizer moments and EMA shadow) along dim 0
in ``torch.chunk`` pieces over a 1-D mesh. The index records each piece's row range, so a run with
another world size reads, for each of its own row ranges, the overlapping rows of the saved
pieces (``safe_open(...).get_slice``), without materialising full tensors. The RNG state of rank
``r`` is the saved rank ``r``'s; ranks beyond the saved world size take rank ``r % saved_world``'s
(a resharded resume is not bit-identical to the uninterrupted run anyway: the batch split differs).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger("unirl")

_TENSOR, _TUPLE = "__tensor__", "__tuple__"
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool,
)}  # fmt: skip


def rank_file(rank: int) -> str:
    """The file of ``rank``'s shards."""
    return f"rank-{rank:05d}.safetensors"


# ---- the state tree <-> JSON skeleton + named tensors -------------------------------------------
def flatten(tree: Any, prefix: str = "") -> tuple[Any, dict[str, torch.Tensor]]:
    """(JSON skeleton, tensors by path): tensors become ``{"__tensor__": path}``, tuples
    ``{"__tuple__": [...]}``; dict keys must be strings (state-dict FQNs, option names)."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            tensors[path] = node
            return {_TENSOR: path}
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                if not isinstance(k, str) or k in (_TENSOR, _TUPLE):
                    raise TypeError(
                        f"sharded checkpoint: state key {k!r} at {path or '/'} must be a plain str"
                    )
                out[k] = walk(v, f"{path}/{k}" if path else k)
            return out
        if isinstance(node, tuple):
            return {_TUPLE: [walk(v, f"{path}/{i}") for i, v in enumerate(node)]}
        if isinstance(node, list):
            return [walk(v, f"{path}/{i}") for i, v in enumerate(node)]
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        raise TypeError(f"sharded checkpoint: {type(node).__name__} at {path} is neither a tensor nor JSON")

    return walk(tree, prefix), tensors


def unflatten(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`flatten`."""
    if isinstance(skeleton, dict):
        if _TENSOR in skeleton:
            return tensors[skeleton[_TENSOR]]
        if _TUPLE in skeleton:
            return tuple(unflatten(v, tensors) for v in skeleton[_TUPLE])
        return {k: unflatten(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [unflatten(v, tensors) for v in skeleton]
    return skeleton


# ---- how a tensor is laid out over the ranks ----------------------------------------------------
def _rows(n: int, world: int, rank: int) -> tuple[int, int]:
    """Row range [start, end) of ``rank`` when ``n`` rows are split like torch.chunk into ``world``."""
    size = math.ceil(n / world) if n else 0
    start = min(rank * size, n)
    return start, min(start + size, n)


def _layout(t: torch.Tensor, path: str) -> str:
    """'shard0' (a DTensor sharded on dim 0 of a 1-D mesh) or 'replicated' (plain or Replicate)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(t, DTensor):
        return "replicated"
    if t.device_mesh.ndim != 1:
        raise ValueError(
            f"sharded checkpoint: {path} lives on a {t.device_mesh.ndim}-D mesh; only 1-D (FSDP) is supported"
        )
    (p,) = t.placements
    if isinstance(p, Shard) and p.dim == 0:
        return "shard0"
    if isinstance(p, Replicate):
        return "replicated"
    raise ValueError(f"sharded checkpoint: {path} has placement {p}; supported: Shard(0), Replicate()")


def _dtype_name(t: torch.Tensor) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"sharded checkpoint: dtype {t.dtype} is not supported (known: {sorted(_DTYPES)})")
    return name


def all_ok(ok: bool, world: int) -> bool:
    """Whether every rank is ok (a tensor all-reduce: ranks fail together instead of one hanging)."""
    if world == 1:
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


# ---- RNG as tensors + JSON ----------------------------------------------------------------------
def _rng_tensors_and_json() -> tuple[dict[str, torch.Tensor], str]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, py_state, gauss_next = random.getstate()
    tensors = {
        "rng/torch": torch.get_rng_state(),
        "rng/numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
    }
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = s
    scalars = {
        "numpy": {
            "kind": str(kind),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": version, "state": list(py_state), "gauss_next": gauss_next},
    }
    return tensors, json.dumps(scalars)


def _restore_rng(f: Any) -> None:
    scalars = json.loads(f.metadata()["rng"])
    torch.set_rng_state(f.get_tensor("rng/torch"))
    n = scalars["numpy"]
    keys = f.get_tensor("rng/numpy_keys").numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = scalars["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    if torch.cuda.is_available():
        names = f.keys()  # safe_open has keys(), not __iter__
        cuda = sorted(k for k in names if k.startswith("rng/cuda/"))
        if cuda:
            torch.cuda.set_rng_state_all([f.get_tensor(f"rng/cuda/{i}") for i in range(len(cuda))])


# ---- save ---------------------------------------------------------------------------------------
def write_shards(tmp: Path, state: Any, rank: int, world: int) -> dict[str, Any]:
    """Write this rank's file into ``tmp``; returns the index (the same on every rank).

    Collective in the failure path: every rank learns whether all ranks wrote their file.
    """
    from safetensors.torch import save_file

    skeleton, tensors = flatten(state)
    table: dict[str, Any] = {}
    mine: dict[str, torch.Tensor] = {}
    error: Exception | None = None
    try:
        for path, t in tensors.items():
            kind = _layout(t, path)
            shape = [int(s) for s in t.shape]
            entry: dict[str, Any] = {"shape": shape, "dtype": _dtype_name(t), "layout": kind}
            if kind == "shard0":
                local = t.to_local()  # type: ignore[attr-defined]  # DTensor
                ranges = [_rows(shape[0], world, r) for r in range(world)]
                start, end = ranges[rank]
                if local.shape[0] != end - start or list(local.shape[1:]) != shape[1:]:
                    raise ValueError(
                        f"sharded checkpoint: {path} local shard {tuple(local.shape)} on rank {rank} is not "
                        f"torch.chunk's rows {start}:{end} of {tuple(shape)}"
                    )
                entry["pieces"] = [[r, a, b] for r, (a, b) in enumerate(ranges) if b > a]
                if end > start:
                    mine[path] = local.detach().cpu().contiguous()
            else:
                entry["pieces"] = [[0, 0, shape[0] if shape else 0]]
                if rank == 0:
                    full = t.full_tensor() if hasattr(t, "full_tensor") else t  # Replicate: local == full
                    mine[path] = full.detach().cpu().contiguous()
            table[path] = entry
        rng, rng_json = _rng_tensors_and_json()
        # clone: safetensors refuses tensors that share storage (tied or viewed state)
        save_file(
            {**{k: v.clone() for k, v in mine.items()}, **rng},
            tmp / rank_file(rank),
            metadata={"rng": rng_json},
        )
    except Exception as e:  # re-raised below, after every rank learned about it
        error = e
    if not all_ok(error is None, world):
        if error is not None:
            raise error
        raise RuntimeError(f"sharded checkpoint: another rank failed to write its shard into {tmp}")
    return {"skeleton": skeleton, "tensors": table}


def manifest(directory: Path, world: int) -> dict[str, int]:
    """Sizes of the files a complete sharded checkpoint has (meta.json excluded)."""
    names = [rank_file(r) for r in range(world)] + ["index.json", "extra.json"]
    return {n: (directory / n).stat().st_size for n in names}


def is_complete(directory: Path, meta: dict[str, Any]) -> str | None:
    """None when every file of the manifest exists with its recorded size, else what is wrong."""
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        return "meta.json has no file manifest"
    for name, size in files.items():
        p = directory / name
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != size:
            return f"{name} has {p.stat().st_size} bytes, the manifest says {size}"
    return None


# ---- load ---------------------------------------------------------------------------------------
class _Files:
    """Lazily opened safetensors files of a checkpoint (one handle per rank file)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.open: dict[int, Any] = {}

    def __call__(self, rank: int) -> Any:
        from safetensors import safe_open

        if rank not in self.open:
            self.open[rank] = safe_open(str(self.directory / rank_file(rank)), framework="pt", device="cpu")
        return self.open[rank]


def _read_rows(files: _Files, path: str, entry: dict[str, Any], start: int, end: int) -> torch.Tensor:
    """Rows [start, end) of the saved tensor ``path`` from whichever pieces overlap them."""
    shape = entry["shape"]
    if not shape:  # a 0-d tensor: one piece, read whole
        return files(entry["pieces"][0][0]).get_tensor(path)
    chunks = []
    for r, a, b in entry["pieces"]:
        lo, hi = max(a, start), min(b, end)
        if lo < hi:
            chunks.append(files(r).get_slice(path)[lo - a : hi - a])
    if not chunks:
        return torch.empty([0, *shape[1:]], dtype=_DTYPES[entry["dtype"]])
    out = torch.cat(chunks) if len(chunks) > 1 else chunks[0]
    if out.shape[0] != end - start:
        raise ValueError(f"sharded checkpoint: {path} rows {start}:{end} are not covered by the saved pieces")
    return out


def read_state(directory: Path, template: Any, rank: int, world: int, saved_world: int) -> Any:
    """The saved state (written by ``saved_world`` ranks) laid out like ``template`` (this rank's
    live state tree), and this rank's RNG restored."""
    from torch.distributed.tensor import DTensor

    index = json.loads((directory / "index.json").read_text())
    table: dict[str, Any] = index["tensors"]
    _, live = flatten(template)
    missing, unexpected = sorted(set(live) - set(table)), sorted(set(table) - set(live))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {directory} does not match this model's state: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]} (same lora config / optimizer / ema?)"
        )
    files = _Files(directory)
    loaded: dict[str, torch.Tensor] = {}
    for path, like in live.items():
        entry = table[path]
        shape = [int(s) for s in like.shape]
        if entry["shape"] != shape or entry["dtype"] != str(like.dtype).removeprefix("torch."):
            raise ValueError(
                f"checkpoint {directory}: {path} was saved as {entry['dtype']}{entry['shape']}, this run has "
                f"{like.dtype}{shape}"
            )
        if isinstance(like, DTensor) and _layout(like, path) == "shard0":
            start, end = _rows(shape[0], world, rank)
            local = _read_rows(files, path, entry, start, end).to(like.device)
            loaded[path] = DTensor.from_local(
                local,
                like.device_mesh,
                like.placements,
                run_check=False,
                shape=like.shape,
                stride=like.stride(),
            )
        else:
            full = _read_rows(files, path, entry, 0, shape[0] if shape else 0).to(like.device)
            if isinstance(like, DTensor):
                full = DTensor.from_local(full, like.device_mesh, like.placements, run_check=False)
            loaded[path] = full
    source = rank if rank < saved_world else rank % saved_world
    if world != saved_world and rank == 0:
        log.warning("resharding checkpoint %s from %d to %d ranks", directory, saved_world, world)
    _restore_rng(files(source))
    return unflatten(index["skeleton"], loaded)


def consolidate(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of a sharded checkpoint as one full tensor, by state path (e.g.
    ``model/layer.weight``): export to a single file, inspection, tests. Runs in one process."""
    d = Path(directory)
    table = json.loads((d / "index.json").read_text())["tensors"]
    files = _Files(d)
    return {p: _read_rows(files, p, e, 0, e["shape"][0] if e["shape"] else 0) for p, e in table.items()}
