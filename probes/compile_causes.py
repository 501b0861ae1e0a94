"""Why torch.compile compiled again, and where it broke the graph: read from what TorchDynamo
keeps anyway, for the compile probe (probes/compile.py), at each compilation's end and when the
probe stops, never at a step.

- **Recompilations.** Before a frame compiles again, Dynamo evaluates why each of its compiled
  versions' guards failed and appends one line per version to
  ``torch._dynamo.guards.guard_failures`` (its code object -> the lines, e.g. ``"0/1: tensor
  'x' size mismatch at index 1. expected 16, actual 24"``). The lines new since the last look are
  one recompilation's; the first names the guard the newest version failed (older torch: the
  line has no compile id, or is a list of guards).
- **Graph breaks.** Dynamo says each break it meets while tracing (its reason and the user
  code's traceback) on its ``graph_breaks`` logging artifact, a logger that stays silent unless
  ``TORCH_LOGS=graph_breaks`` turns it on. A handler is added to it; where the job did not turn it
  on, its level is raised for the handler alone (no propagation: nothing is printed) and put back
  at the end. Each break is kept as its reason and the innermost frame of the job's own code
  (not torch's), counted.

Both go to the process's meta, ``compile_causes`` (doctor.store.process_meta), bounded. A torch
that keeps neither (older than these hooks, or of another shape) records nothing: no error.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections import Counter
from typing import Any

from ..record.session import Session
from ..store.records import compile_frame

MAX_RECOMPILES = 200  # recompilations kept with their reason (the count goes on)
MAX_BREAKS = 50  # distinct graph breaks (reason, file, line) kept
MAX_TEXT = 300
BREAK_ARTIFACT = ".__graph_breaks"
_COMPILE_ID = re.compile(r"^\s*\[?(\d+)/(\d+)\]?:\s*")
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_USER_AT = re.compile(r"in user code at (.+?):(\d+)")
_REASON = re.compile(r"Graph Break Reason:\s*(.+)|Graph break:?\s*(.+?)(?: from user code|$)")


def first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()[:MAX_TEXT]


def guard_reason(line: str) -> tuple[int | None, str]:
    """(the frame whose compiled version failed, or None where the line does not say; the guard
    that failed) of one line of ``guard_failures``."""
    found = _COMPILE_ID.match(line)
    text = line[found.end():] if found else line
    text = text.split("User stack trace:", 1)[0]
    # a guard on a Python value carries its source line after two spaces and a '#'
    text = re.split(r"\s{2,}#", first_line(text), maxsplit=1)[0].strip()
    return (int(found.group(1)) if found else None), text


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return os.path.dirname(path) + os.sep if path else os.sep + "torch" + os.sep


def graph_break(message: str, torch_dir: str) -> tuple[str, str, int] | None:
    """(reason, file, line) of one graph-break log message: the innermost frame of its user
    traceback that is not torch's own, else the place Dynamo names; None if it names none."""
    reason = ""
    found = _REASON.search(message)
    if found:
        reason = first_line(found.group(1) or found.group(2) or "")
    frames = [(f, int(n)) for f, n in _FILE_LINE.findall(message)]
    mine = [(f, n) for f, n in frames if not f.startswith(torch_dir)]
    if mine:
        file, line = mine[-1]
    else:
        at = _USER_AT.search(message)
        if at is None and not frames:
            return None
        file, line = (at.group(1), int(at.group(2))) if at else frames[-1]
    if not reason:
        reason = first_line(message)
    return reason, file, line


class _BreakHandler(logging.Handler):
    def __init__(self, causes: CompileCauses) -> None:
        super().__init__(logging.DEBUG)
        self.causes = causes

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.causes.saw_break(record.getMessage())
        except Exception:  # never into Dynamo's tracing
            pass


class CompileCauses:
    """What the compile probe calls: ``start`` once torch._dynamo is imported, ``compiled``
    after each compilation (with its frame and which one of it), ``stop`` at the end."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.recompiles: list[dict[str, Any]] = []
        self.recompile_count = 0
        self.breaks: Counter[tuple[str, str, int]] = Counter()
        self.breaks_dropped = 0
        self._seen: dict[int, int] = {}  # id(code) -> lines of guard_failures read
        self._failures: Any = None
        self._loggers: list[tuple[logging.Logger, int, bool]] = []
        self._handler = _BreakHandler(self)
        self._torch_dir = ""
        self._changed = False

    def start(self) -> None:
        self._torch_dir = _torch_dir()
        guards = sys.modules.get("torch._dynamo.guards")
        failures = getattr(guards, "guard_failures", None)
        if isinstance(failures, dict):
            self._failures = failures
        for name, logger in list(logging.Logger.manager.loggerDict.items()):
            if name.startswith("torch.") and name.endswith(BREAK_ARTIFACT) and \
                    isinstance(logger, logging.Logger):
                self._loggers.append((logger, logger.level, logger.propagate))
                if not logger.isEnabledFor(logging.DEBUG):  # the job did not ask: silent
                    logger.propagate = False
                    logger.setLevel(logging.DEBUG)
                logger.addHandler(self._handler)

    def saw_break(self, message: str) -> None:
        found = graph_break(message, self._torch_dir)
        if found is None:
            return
        if found in self.breaks or len(self.breaks) < MAX_BREAKS:
            self.breaks[found] += 1
        else:
            self.breaks_dropped += 1
        self._changed = True

    def compiled(self, key: int | None) -> None:
        """After a compilation (``key``: its ring key, None where unknown): the recompilation
        reasons new since the last look, and the meta if anything changed."""
        try:
            self._read_failures(compile_frame(key) if key is not None and key > 0 else None)
            if self._changed:
                self._save()
        except Exception as err:  # a guard_failures of another shape: no reasons
            self._failures = None
            self.session.swallowed("compile", "reading Dynamo's recompile reasons", err)

    def _read_failures(self, compiling: tuple[int, int] | None) -> None:
        if self._failures is None:
            return
        for code, lines in list(self._failures.items()):
            done = self._seen.get(id(code), 0)
            if len(lines) <= done:
                continue
            self._seen[id(code)] = len(lines)
            line = lines[done]  # a list of reasons in torch 2.0's shape: its first
            frame, reason = guard_reason(str(line[0] if isinstance(line, list | tuple) and line
                                             else line))
            nth = compiling[1] if compiling and frame in (None, compiling[0]) else None
            if frame is None and compiling:
                frame = compiling[0]
            self.recompile_count += 1
            self._changed = True
            if len(self.recompiles) < MAX_RECOMPILES:
                self.recompiles.append({
                    "frame": frame, "nth": nth, "reason": reason,
                    "function": str(getattr(code, "co_name", "")),
                    "file": str(getattr(code, "co_filename", "")),
                    "line": int(getattr(code, "co_firstlineno", 0))})

    def _save(self) -> None:
        self._changed = False
        self.session.update_meta(compile_causes={
            "recompiles": self.recompiles, "recompiles_seen": self.recompile_count,
            "graph_breaks": [{"reason": r, "file": f, "line": n, "count": c}
                             for (r, f, n), c in self.breaks.most_common()],
            "graph_breaks_dropped": self.breaks_dropped})

    def stop(self) -> None:
        self.compiled(None)
        for logger, level, propagate in self._loggers:
            logger.removeHandler(self._handler)
            logger.setLevel(level)
            logger.propagate = propagate
        self._loggers = []
