"""What ``doctor run`` says while the job runs: a line as it starts, and a line as the deep
window opens and as it closes. Nothing per step.

The lines are made here and handed to a ``say`` callback (``doctor run`` prints them on stderr;
``doctor try`` and ``doctor.watch`` pass none and stay silent), so that this module prints
nothing itself. The window's state comes from the run's control file (doctor.store.control),
where each process of the job posts it with its steps and its clock (``time.perf_counter``): a
window's seconds are told by the process's own clock, never compared with the parent's. The
parent's clock only says how long to wait for the other ranks before the open line: ranks open
their windows on the same step, so a rank that has not posted within GRACE_S is left out of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from doctor.store import layout
from doctor.store.control import Control, read_control
from doctor.store.process_meta import read_meta
from doctor.verdict import ProbeStatus

Say = Callable[[str], None]

#: How long the open line waits for every rank's window to open (seconds of the parent's clock).
GRACE_S = 2.0
#: The longest failure reason quoted in a line (the report has all of it).
MAX_REASON = 160

ACTIVE, DONE, FAILED = "active", "done", "failed"
BY_FORK = "fork"  # closed_by of a window a fork closed (doctor.probes.torch_ops says the same)


def start_line(name: str, run_dir: Path, probes: Mapping[str, ProbeStatus],
               window: tuple[int, int]) -> str:
    """The line ``doctor run`` says as the job starts: what it records, and where.

    ``probes`` is the parent's probes' status once they have started (host, gpu, stacks: what
    runs outside the job); ``window`` is (START, STEPS) as the job's bootstrap reads it, STEPS 0
    when it is off. Stacks are sampled while the window is open, so not at all without it."""
    start, steps = window
    recorded = ["steps", "DataLoader waits"]
    if _ok(probes, "host"):
        recorded.append("CPU/IO samples")
    if _ok(probes, "gpu"):
        recorded.append("GPU samples")
    if steps and _ok(probes, "stacks"):
        in_process = probes["stacks"].reason.startswith("in-process")
        recorded.append("stack samples (in-process)" if in_process else "stack samples")
    recorded.append(f"torch.profiler at steps {start}-{start + steps - 1}" if steps
                    else "torch.profiler off")
    return (f"doctor: recording {_printable(name)} into {_shown(run_dir)} "
            f"({', '.join(recorded)}); Ctrl-C stops the job and still writes a partial report")


def _ok(probes: Mapping[str, ProbeStatus], name: str) -> bool:
    status = probes.get(name)
    return status is not None and status.ok


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies inside it (as typed, mostly)."""
    here = Path.cwd()
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


@dataclass(frozen=True)
class ProcessWindow:
    """One process's deep window, as the control file tells it (seconds on its own clock)."""

    rank: int
    pid: int
    state: str  # active, done or failed
    steps: int | None = None
    opened_s: float | None = None  # when it opened (None: it failed before it opened)
    ended_s: float | None = None  # when it closed or failed
    closed_by: str | None = None  # closed: its steps were done ("steps"), a "fork", the "exit"

    @property
    def ended(self) -> bool:
        return self.state in (DONE, FAILED)

    @property
    def seconds(self) -> float | None:
        if self.opened_s is None or self.ended_s is None:
            return None
        return max(0.0, self.ended_s - self.opened_s)


def process_windows(control: Control) -> list[ProcessWindow]:
    """Every process's window that has posted a state, in order of rank, then pid."""
    out = []
    for (rank, pid), state in sorted(control.windows.items()):
        facts = control.window_facts.get((rank, pid), {})
        opened, ended = facts.get(ACTIVE, {}), facts.get(state, {}) if state != ACTIVE else {}
        # closed: the steps it profiled, which a fork or the job's end may have cut short
        steps = ended.get("steps") if state == DONE and "steps" in ended else opened.get(
            "steps", ended.get("steps"))
        closed_by = ended.get("closed_by")
        out.append(ProcessWindow(rank, pid, state, _int(steps), _float(opened.get("t_s")),
                                 _float(ended.get("t_s")),
                                 closed_by if isinstance(closed_by, str) else None))
    return out


class WindowProgress:
    """Says, once for the job, when the deep window opens and when it closes (or fails).

    ``tick(now)`` at each of the parent's ticks, ``finish()`` once the job has exited. ``stacks``
    says whether stack sampling runs beside the window (the parent's stacks probe)."""

    def __init__(self, run_dir: Path, say: Say, *, stacks: Callable[[], bool] = lambda: True,
                 grace_s: float = GRACE_S) -> None:
        self.run_dir = run_dir
        self.say = say
        self.stacks = stacks
        self.grace_s = grace_s
        self._first_seen: float | None = None
        self._opened_said = False
        self._done = False

    def tick(self, now: float) -> None:
        if self._done:
            return
        windows = process_windows(read_control(self.run_dir))
        if not windows:
            return
        if self._first_seen is None:
            self._first_seen = now
        ranks = self._ranks(windows)
        if not self._opened_said:
            waiting = ranks - {w.rank for w in windows}
            if waiting and now - self._first_seen < self.grace_s:
                return
            opened = [w for w in windows if w.opened_s is not None]
            if opened:
                self.say(self._open_line(opened, len(ranks)))
            self._opened_said = True
        if all(w.ended for w in windows):
            self.say(self._end_line(windows, len(ranks), at_exit=False))
            self._done = True

    def finish(self) -> None:
        """After the job: say how the window ended if no tick saw it (the job ended in it)."""
        if self._done:
            return
        self._done = True
        windows = process_windows(read_control(self.run_dir))
        if not windows:
            return
        total = len(self._ranks(windows))
        ended = [w for w in windows if w.ended]
        if ended:
            self.say(self._end_line(ended, total, at_exit=True))
        still = [w for w in windows if not w.ended]
        if still:
            self.say(f"doctor: deep window still open on {_ranks_text(still, total)} when the "
                     "job ended (the report says what it kept)")

    def _ranks(self, windows: list[ProcessWindow]) -> set[int]:
        """The job's ranks: those with a training process's folder, and those that posted."""
        mains = {rank for _d, rank, role, _pid in layout.process_dirs(self.run_dir)
                 if role == "main"}
        return mains | {w.rank for w in windows}

    def _open_line(self, opened: list[ProcessWindow], total: int) -> str:
        what = "torch.profiler and stack sampling" if self.stacks() else "torch.profiler"
        steps = _steps_text(opened)
        return (f"doctor: deep window open on {_ranks_text(opened, total)} "
                f"({steps + '; ' if steps else ''}{what})")

    def _end_line(self, windows: list[ProcessWindow], total: int, at_exit: bool) -> str:
        closed = [w for w in windows if w.state == DONE]
        failed = [w for w in windows if w.state == FAILED]
        parts = []
        if closed:
            when = " as the job ended" if at_exit else ""
            # a window closed at exit has fewer steps than it was set for
            steps = _steps_text(closed)
            steps = f"up to {steps}" if steps and at_exit else steps
            took = _seconds_text(closed)
            facts = " in ".join(p for p in (steps, took) if p)
            forked = any(w.closed_by == BY_FORK for w in closed)
            parts.append(f"deep window closed on {_ranks_text(closed, total)}{when}"
                         f"{' early, as the process forked' if forked else ''}"
                         f"{': ' + facts if facts else ''} (left out of the shares)")
        if failed:
            lead = "failed on" if closed else "deep window failed on"
            reason = self._reason(failed)
            parts.append(f"{lead} {_ranks_text(failed, total)}"
                         f"{': ' + reason if reason else ' (the report says why)'}")
        return "doctor: " + "; ".join(parts)

    def _reason(self, failed: list[ProcessWindow]) -> str:
        """The first failed process's reason, from its meta.json (the report has each one)."""
        reasons = [r for r in (self._reason_of(w) for w in failed) if r]
        if not reasons:
            return ""
        more = " (the report has each rank's)" if len(set(reasons)) > 1 else ""
        return reasons[0] + more

    def _reason_of(self, window: ProcessWindow) -> str:
        for proc_dir, rank, _role, pid in layout.process_dirs(self.run_dir):
            if (rank, pid) != (window.rank, window.pid):
                continue
            reason = read_meta(proc_dir).window.get("reason")
            return _printable(str(reason), MAX_REASON) if reason else ""
        return ""


def _ranks_text(windows: list[ProcessWindow], total: int) -> str:
    ranks = sorted({w.rank for w in windows})
    if len(ranks) == 1:
        return f"rank {ranks[0]}" + (f" of {total}" if total > 1 else "")
    if len(ranks) >= total:
        return f"{len(ranks)} ranks"
    return f"{len(ranks)} of {total} ranks ({', '.join(str(r) for r in ranks)})"


def _steps_text(windows: list[ProcessWindow]) -> str:
    counts = sorted({w.steps for w in windows if w.steps})
    if not counts:
        return ""
    return f"{counts[0]} steps" if len(counts) == 1 else f"{counts[0]}-{counts[-1]} steps"


def _seconds_text(windows: list[ProcessWindow]) -> str:
    spans = sorted(s for s in (w.seconds for w in windows) if s is not None)
    if not spans:
        return ""
    low, high = _seconds(spans[0]), _seconds(spans[-1])
    return f"{low} s" if low == high else f"{low}-{high} s"


def _seconds(value: float) -> str:
    return f"{value:.1f}" if value >= 0.1 else f"{value:.2f}"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def _printable(text: str, limit: int | None = None) -> str:
    """One line, safe for a terminal (no escape sequences), at most ``limit`` characters."""
    text = " ".join(_CONTROL.sub(" ", text).split())
    if limit is not None and len(text) > limit:
        text = text[:limit - 3].rstrip() + "..."
    return text


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


__all__ = ["GRACE_S", "ProcessWindow", "Say", "WindowProgress", "process_windows",
           "start_line"]
