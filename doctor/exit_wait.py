"""Waiting for the job to end without waking up while it runs.

``Popen.wait(timeout)`` polls: it sleeps 0.5 ms, 1 ms, ... up to 50 ms between ``waitpid`` calls,
about 28 wake-ups a second with the parent's 2 Hz sampling, each taken from a core the job's
threads use. A pidfd (Linux 5.3+) becomes readable when the process ends, so ``poll`` on it
sleeps until the job ends or the next sample is due: 2 wake-ups a second. Where there is no pidfd
(an older kernel, macOS), ``Popen.wait`` does as before.
"""

from __future__ import annotations

import os
import select
import subprocess


class ExitWait:
    """``wait(timeout_s)``: the job's exit status (``Popen.returncode``) once it has ended, None
    when ``timeout_s`` passed first."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._poller: select.poll | None = None
        self._fd = -1
        try:
            self._fd = os.pidfd_open(proc.pid)
            self._poller = select.poll()
            self._poller.register(self._fd, select.POLLIN)
        except (AttributeError, OSError):  # no pidfd here: Popen.wait polls instead
            self.close()

    def wait(self, timeout_s: float) -> int | None:
        if self._poller is not None:
            # a signal forwarded to the job interrupts poll; Python retries it (PEP 475)
            if not self._poller.poll(max(0, int(timeout_s * 1000) + 1)):
                return None
            return self.proc.wait()  # readable: the job has ended; reap it
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        self._poller = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
