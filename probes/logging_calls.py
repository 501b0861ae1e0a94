"""Logging probe: the training thread's time in logging and metrics calls.

The calls that log are wrapped where the job already imported their library, or right after it
does (doctor.record.after_import): doctor never imports them itself. What is wrapped (LIBRARIES):
Python's ``logging`` (``Logger.callHandlers``: once per record that passed its level, so a
``logger.debug`` filtered out costs nothing), TensorBoard's ``SummaryWriter.add_*`` and
``flush`` (torch.utils.tensorboard and tensorboardX), ``wandb``'s ``Run.log`` (which
``wandb.log`` calls), and ``mlflow``'s ``log_*`` and ``set_tag(s)``.

Every call on the main thread is counted with its time, per library (a few hundred nanoseconds:
two clock reads and two additions; nothing written), and the counts go to meta.json
(``logging``) as the process closes. A call of WRITTEN_NS or more also goes to the ``logging``
ring (an interval: start and end on the Session's clock; its key: the library, LOG_KINDS), so
that the steps it made slow are found (doctor.analyse.phases). A call inside another (wandb's
``log`` inside a logging handler) is part of the outer one; calls from other threads (an
asynchronous writer's) do not stall the loop and are not counted. ``.item()`` syncs made for
logging are not told apart from the others: they show as the loop's own time.

Runs inside the job; a failure of the measurement is caught and said as the probe's reason
(doctor.record.guard), never raised into the job's call, whose own errors pass through untouched.
``stop`` puts every original back.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

from ..record.after_import import ImportWraps
from ..record.session import CLOSE, Session
from ..store.records import LOG_KINDS
from ..verdict import ProbeStatus

WRITTEN_NS = 1_000_000  # a call this long (1 ms) or longer is written to the ring too
_WRITER_METHODS = ("add_scalar", "add_scalars", "add_histogram", "add_image", "add_images",
                   "add_figure", "add_text", "add_audio", "add_video", "add_embedding",
                   "add_pr_curve", "add_mesh", "add_hparams", "add_graph", "flush")
#: module -> (the class in it whose methods are wrapped, or "" for the module's functions,
#: the functions, the library: an index of LOG_KINDS)
LIBRARIES: dict[str, tuple[str, tuple[str, ...], int]] = {
    "logging": ("Logger", ("callHandlers",), 0),
    "torch.utils.tensorboard.writer": ("SummaryWriter", _WRITER_METHODS, 1),
    "tensorboardX.writer": ("SummaryWriter", _WRITER_METHODS, 1),
    "wandb.sdk.wandb_run": ("Run", ("log",), 2),
    "mlflow": ("", ("log_metric", "log_metrics", "log_param", "log_params", "log_dict",
                    "log_text", "log_figure", "log_image", "log_table", "log_artifact",
                    "log_artifacts", "set_tag", "set_tags"), 3),
}


class LoggingProbe:
    name = "logging"

    def __init__(self, session: Session) -> None:
        self.session = session
        self._wraps = ImportWraps()
        self._depth = 0
        self._main = threading.main_thread().ident
        self._pid = session.pid
        self._reset()

    def _reset(self) -> None:
        self.calls = [0] * len(LOG_KINDS)
        self.took_ns = [0] * len(LOG_KINDS)
        self.written = 0

    def _forked(self) -> None:
        self._pid = self.session.pid
        self._main = threading.main_thread().ident
        self._reset()
        self.session.on(CLOSE, self._close)  # the child's Session forgot its listeners

    def check(self) -> ProbeStatus:
        return ProbeStatus(True)

    def start(self) -> None:
        self.session.on(CLOSE, self._close)
        self._wraps.on_import(LIBRARIES, self._wrap_module)

    def sample(self) -> None:
        pass  # the wrapped calls count as the job runs

    def stop(self) -> None:
        self._wraps.undo()

    def _wrap_module(self, module: str) -> None:
        found = sys.modules.get(module)
        owner_name, names, kind = LIBRARIES[module]
        owner = getattr(found, owner_name, None) if owner_name else found
        if owner is None:
            return
        for name in names:
            self._wrap(owner, name, kind)

    def _wrap(self, owner: Any, name: str, kind: int) -> None:
        orig = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if orig is None or not callable(orig) or getattr(orig, "_doctor_wrapped", False):
            return
        probe, clock, get_ident = self, self.session.clock, threading.get_ident

        @functools.wraps(orig)
        def logged(*args: Any, **kwargs: Any) -> Any:
            if probe._depth or get_ident() != probe._main:
                return orig(*args, **kwargs)
            probe._depth = 1
            t0 = clock()
            try:
                return orig(*args, **kwargs)
            finally:
                t1 = clock()
                probe._depth = 0
                probe._count(kind, t0, t1)

        logged._doctor_wrapped = True  # type: ignore[attr-defined]
        self._wraps.patches.put(owner, name, logged)

    def _count(self, kind: int, t0: int, t1: int) -> None:
        try:
            if self.session.pid != self._pid:  # a forked child: its own counts from now
                self._forked()
            self.calls[kind] += 1
            self.took_ns[kind] += t1 - t0
            if t1 - t0 >= WRITTEN_NS and self.session.recording:
                self.session.record_interval("logging", t0, t1, kind)
                self.written += 1
        except Exception as err:  # a measurement never fails the job's call
            self.session.swallowed(self.name, "timing a logging call", err)

    def _close(self) -> None:
        """Per library, the calls and their time, in the process's meta.json (where it
        recorded anything)."""
        try:
            if self.session.recording and any(self.calls):
                self.session.update_meta(logging={
                    "kinds": list(LOG_KINDS), "calls": list(self.calls),
                    "took_ns": list(self.took_ns), "written": self.written,
                    "written_ns": WRITTEN_NS})
        except Exception as err:
            self.session.swallowed(self.name, "saving the logging calls' counts", err)


__all__ = ["LIBRARIES", "WRITTEN_NS", "LoggingProbe"]
