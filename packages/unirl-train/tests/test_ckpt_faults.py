"""Checkpoint saves that fail: a disk that fills up mid-save, a read-only run directory.

Each must raise one clear OSError (what failed, why, what is left, what to do; errno kept),
leave nothing half-written behind (a full disk gets its space back), and leave the previous
checkpoint at the same path intact: ``latest_complete`` returns it and it loads, bit-exact.

Disk full is simulated at every write of a save in turn (``torch.save``, ``Path.write_text`` /
``write_bytes``, safetensors ``save_file``): that write puts half its bytes on disk, then raises
ENOSPC. Read-only is a real ``chmod`` where that blocks writes (not as root) and otherwise a
``mkdir`` raising EROFS, as a read-only mount does.
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch as st
import torch

from unirl.train import checkpoint as ckpt
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.optim import AdamWConfig
from unirl.train.stack import TrainStack

FORMATS = ["full", "sharded"]


def build(tiny: Any) -> tuple[Any, TrainStack]:
    torch.manual_seed(0)
    backend = FSDPConfig(optimizer=AdamWConfig(lr=0.05)).build(tiny.BigramPolicy(), "cpu")
    geometry = BatchGeometry(micro_batch_size=4, num_updates_per_batch=1)
    return backend, TrainStack(backend, tiny.TokenPPO(), tiny.TokenPipeline(backend.module), geometry)


def train_step(tiny: Any, stack: TrainStack, seed: int) -> None:
    parts = tiny.token_parts(8, seed=seed)
    for p in parts:
        p.advantage = float(np.random.randn())
    stack.train_on(parts)


def weights(backend: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backend.module.state_dict().items()}


class DiskFull:
    """Patches every writer a save uses; write number ``fail_at`` (0-based) fills the disk."""

    def __init__(self, mp: pytest.MonkeyPatch, fail_at: int | None) -> None:
        self.fail_at, self.writes = fail_at, 0
        real_save, real_text, real_bytes, real_st = (
            torch.save,
            Path.write_text,
            Path.write_bytes,
            st.save_file,
        )

        def full(path: Any, data: bytes) -> None:
            real_bytes(Path(path), data[: len(data) // 2])  # half of it made it to disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        def wrap(encode: Callable[..., bytes], real: Callable[..., Any]) -> Callable[..., Any]:
            def write(path: Any, data: Any, *a: Any, **kw: Any) -> Any:
                n, self.writes = self.writes, self.writes + 1
                if n == self.fail_at:
                    full(path, encode(data, *a, **kw))
                return real(path, data, *a, **kw)

            return write

        def torch_bytes(obj: Any, *a: Any, **kw: Any) -> bytes:
            buf = io.BytesIO()
            real_save(obj, buf)
            return buf.getvalue()

        save = wrap(torch_bytes, lambda f, obj, *a, **kw: real_save(obj, f, *a, **kw))
        mp.setattr(torch, "save", lambda obj, f, *a, **kw: save(f, obj, *a, **kw))
        mp.setattr(Path, "write_text", wrap(lambda d, *a, **kw: d.encode(), real_text))
        mp.setattr(Path, "write_bytes", wrap(lambda d, *a, **kw: bytes(d), real_bytes))
        stw = wrap(lambda t, *a, **kw: st.save(t, kw.get("metadata")), lambda p, t, **kw: real_st(t, p, **kw))
        mp.setattr(st, "save_file", lambda tensors, filename, **kw: stw(filename, tensors, **kw))


@pytest.fixture
def previous(tiny: Any, tmp_path: Path) -> Iterator[tuple[Any, TrainStack, Path, dict[str, torch.Tensor]]]:
    """A backend that saved a checkpoint at `tmp_path/latest` (step 1) and trained on (step 2)."""
    backend, stack = build(tiny)
    train_step(tiny, stack, 0)
    yield backend, stack, tmp_path / "latest", weights(backend)


def _prev_intact(tiny: Any, slot: Path, want: dict[str, torch.Tensor], step: int) -> None:
    assert ckpt.latest_complete(slot) == slot
    other, _ = build(tiny)
    assert ckpt.load_checkpoint(slot, other) == {"rl_step": step}
    got = weights(other)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert not list(slot.parent.glob("latest.tmp-*"))  # nothing half-written left


def _writes_per_save(fmt: str, backend: Any, tmp: Path, mp: pytest.MonkeyPatch) -> int:
    with pytest.MonkeyPatch.context() as m:
        counter = DiskFull(m, None)
        ckpt.save_checkpoint(
            tmp / "count", backend, extra={"rl_step": 0}, format=fmt, files={"buffer": b"x" * 64}
        )
    return counter.writes


@pytest.mark.parametrize("fmt", FORMATS)
def test_disk_full_at_every_write_keeps_the_previous_checkpoint(
    tiny: Any, previous: Any, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, stack, slot, _ = previous
    ckpt.save_checkpoint(slot, backend, extra={"rl_step": 1}, format=fmt)
    before = weights(backend)
    train_step(tiny, stack, 1)
    n = _writes_per_save(fmt, backend, slot.parent, monkeypatch)
    assert (
        n == 5
    )  # full: rng, state, extra, files/buffer, meta; sharded: shard, index, extra, files/buffer, meta
    for k in range(n):
        with pytest.MonkeyPatch.context() as m:
            DiskFull(m, k)
            with pytest.raises(OSError) as e:
                ckpt.save_checkpoint(
                    slot, backend, extra={"rl_step": 2}, format=fmt, files={"buffer": b"x" * 64}
                )
        msg = str(e.value)
        assert e.value.errno == errno.ENOSPC, msg
        assert f"checkpoint save to {slot} failed: the disk is full" in msg, msg
        assert f"the last complete checkpoint, {slot} (global step 1), is intact" in msg, msg
        assert "Free space on (or make writable)" in msg, msg
        _prev_intact(tiny, slot, before, 1)
    ckpt.save_checkpoint(slot, backend, extra={"rl_step": 2}, format=fmt)  # space back: saves again
    assert ckpt.load_checkpoint(slot, build(tiny)[0]) == {"rl_step": 2}


@pytest.mark.parametrize("fmt", FORMATS)
def test_read_only_run_directory(tiny: Any, previous: Any, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, stack, slot, _ = previous
    ckpt.save_checkpoint(slot, backend, extra={"rl_step": 1}, format=fmt)
    before = weights(backend)
    train_step(tiny, stack, 1)
    root = slot.parent
    root.chmod(0o555)
    try:
        if os.access(root, os.W_OK):  # root ignores the mode bits: a read-only mount, then
            real_mkdir = Path.mkdir

            def ro_mkdir(self: Path, *a: Any, **kw: Any) -> None:
                if self.parent == root:
                    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
                real_mkdir(self, *a, **kw)

            monkeypatch.setattr(Path, "mkdir", ro_mkdir)
            why, code = "the file system is read-only", errno.EROFS
        else:
            why, code = "no permission to write there", errno.EACCES
        with pytest.raises(OSError) as e:
            ckpt.save_checkpoint(slot, backend, extra={"rl_step": 2}, format=fmt)
        monkeypatch.undo()
    finally:
        root.chmod(0o755)
    assert e.value.errno == code
    assert f"checkpoint save to {slot} failed: {why}" in str(e.value)
    assert f"the last complete checkpoint, {slot} (global step 1), is intact" in str(e.value)
    _prev_intact(tiny, slot, before, 1)


def test_rename_failing_midway_leaves_a_complete_checkpoint(
    tiny: Any, previous: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new checkpoint is written but moving it into place fails after the old one was moved
    aside: a resume still finds a complete checkpoint (the newest: the new one, not yet renamed)."""
    backend, stack, slot, _ = previous
    ckpt.save_checkpoint(slot, backend, extra={"rl_step": 1})
    train_step(tiny, stack, 1)
    after = weights(backend)
    real_replace, calls = os.replace, []

    def replace(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 2:  # the old one went to .old; the new one cannot follow
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(
        OSError, match="the disk is full.*the last complete checkpoint, .*latest.tmp-2 \\(global step 2\\)"
    ):
        ckpt.save_checkpoint(slot, backend, extra={"rl_step": 2})
    monkeypatch.undo()
    found = ckpt.latest_complete(slot)
    assert found == slot.with_name("latest.tmp-2")
    other, _ = build(tiny)
    assert ckpt.load_checkpoint(found, other) == {"rl_step": 2}
    assert all(torch.equal(weights(other)[k], v) for k, v in after.items())
