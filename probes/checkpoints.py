"""Checkpoints probe: each checkpoint the training thread writes, its time and the bytes written.

``torch.save`` is wrapped as the probe starts (with torch); ``safetensors.torch.save_file`` and
``torch.distributed.checkpoint``'s ``save`` and ``async_save`` are wrapped where the job already
imported them, or right after it does (doctor.record.after_import): doctor never
imports them itself. Each call on the main thread goes to the ``checkpoint`` ring (an interval:
start and end on the Session's clock; its key: the kind of save and the bytes written,
doctor.store.records.checkpoint_key). The bytes are the file's size after the save where it was
given a path, the file object's position moved by it where that can be told, the new files under
a torch.distributed.checkpoint folder; not known otherwise. A save inside another (torch.save
called by torch.distributed.checkpoint) is part of the outer one; saves from other threads (an
asynchronous checkpointer's) do not stall the loop and are not recorded.

Nothing is written before the process records anything else (a helper process that saves a file
leaves no folder). Runs inside the job; a failure of the measurement is caught and said as the
probe's reason (doctor.record.guard), never raised into the job's save, whose own errors pass
through untouched. ``stop`` puts every original back.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..record.after_import import ImportWraps
from ..record.session import Session
from ..store.records import CHECKPOINT_KINDS, checkpoint_key
from ..verdict import ProbeStatus

TORCH_SAVE, SAFETENSORS, DCP, DCP_ASYNC = range(len(CHECKPOINT_KINDS))
MAX_FILES = 10_000  # files of a torch.distributed.checkpoint folder looked at for its bytes

#: module -> (function, kind, where its path is: positional index, keyword)
LAZY: dict[str, tuple[tuple[str, int, int, str], ...]] = {
    "safetensors.torch": (("save_file", SAFETENSORS, 1, "filename"),),
    "torch.distributed.checkpoint": (("save", DCP, -1, "checkpoint_id"),
                                     ("async_save", DCP_ASYNC, -1, "checkpoint_id")),
}


class CheckpointProbe:
    name = "checkpoints"

    def __init__(self, session: Session) -> None:
        self.session = session
        self._wraps = ImportWraps()
        self._depth = 0

    def check(self) -> ProbeStatus:
        return ProbeStatus(True)

    def start(self) -> None:
        import torch

        self._wrap(torch, "save", TORCH_SAVE, 1, "f")
        self._wraps.on_import(LAZY, self._wrap_module)

    def sample(self) -> None:
        pass  # the wrapped saves record as the job runs

    def stop(self) -> None:
        self._wraps.undo()

    def _wrap_module(self, module: str) -> None:
        owner = sys.modules.get(module)
        for name, kind, index, keyword in LAZY[module]:
            self._wrap(owner, name, kind, index, keyword)

    def _wrap(self, owner: Any, name: str, kind: int, index: int, keyword: str) -> None:
        orig = getattr(owner, name, None)
        if orig is None or getattr(orig, "_doctor_wrapped", False):
            return
        probe, session, clock = self, self.session, self.session.clock

        @functools.wraps(orig)
        def save(*args: Any, **kwargs: Any) -> Any:
            if probe._depth or threading.current_thread() is not threading.main_thread():
                return orig(*args, **kwargs)
            target = kwargs.get(keyword, args[index] if 0 <= index < len(args) else None)
            if target is None and kind in (DCP, DCP_ASYNC):
                target = getattr(kwargs.get("storage_writer"), "path", None)
            before = _position(target)
            probe._depth += 1
            t0 = clock()
            try:
                out = orig(*args, **kwargs)
            finally:
                probe._depth -= 1
            t1 = clock()
            try:
                if session.recording:
                    written = _written(target, before, kind)
                    session.record_interval("checkpoint", t0, t1, checkpoint_key(kind, written))
            except Exception as err:  # a measurement never fails the job's save
                session.swallowed(probe.name, f"recording a {CHECKPOINT_KINDS[kind]}", err)
            return out

        save._doctor_wrapped = True  # type: ignore[attr-defined]
        self._wraps.patches.put(owner, name, save)


def _position(target: Any) -> int | None:
    """A file object's position before the save (None: a path, or one that cannot tell)."""
    if target is None or isinstance(target, (str, bytes, os.PathLike)):
        return None
    tell: Callable[[], int] | None = getattr(target, "tell", None)
    try:
        return int(tell()) if tell is not None else None
    except Exception:  # an unseekable stream: its bytes are not known
        return None


def _written(target: Any, before: int | None, kind: int) -> int | None:
    """The bytes a save wrote to ``target`` (None: not known)."""
    if target is None:
        return None
    if before is not None:
        after = _position(target)
        return after - before if after is not None and after >= before else None
    if not isinstance(target, (str, bytes, os.PathLike)):
        return None
    path = os.fsdecode(target)
    if kind in (DCP, DCP_ASYNC):
        return _folder_bytes(path) if kind == DCP else None
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _folder_bytes(path: str) -> int | None:
    """The bytes of the files in a torch.distributed.checkpoint folder (every rank's: a
    collective save writes them together), at most MAX_FILES files looked at."""
    total = seen = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                seen += 1
                if seen > MAX_FILES:
                    break
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        return None
    return total
