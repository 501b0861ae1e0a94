"""A small driver for headless Chromium over the Chrome DevTools Protocol, for tests.

The browser is started with ``--remote-debugging-pipe``: it reads commands from its file
descriptor 3 and writes replies and events to its descriptor 4, one JSON message each, ended by a
NUL byte. Nothing listens on a port, and nothing here needs more than the standard library.

Every wait has a deadline, so a browser that hangs fails the test instead of hanging CI, and the
browser's whole process group is killed when the driver closes, whatever happened before.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Executables tried in order by find_chromium() when DOCTOR_CHROMIUM is not set.
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

#: Headless and quiet: no GPU, no sandbox (containers refuse it), no network of its own, no
#: first-run pages, extensions, sync, crash or metrics uploads.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-domain-reliability",
    "--disable-breakpad",
    "--disable-client-side-phishing-detection",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--metrics-recording-only",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-pings",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)

#: URL schemes a self-contained page may load from without leaving the machine.
LOCAL_SCHEMES = ("file:", "data:", "about:")

#: Run by a Python in the browser's place (argv: fd, fd, browser, its arguments): it moves the two
#: pipe ends to the descriptors 3 and 4 that --remote-debugging-pipe reads and writes, then
#: becomes the browser. (subprocess can pass descriptors on, but not renumber them.)
MOVE_TO_3_AND_4 = ("import os, sys; a, b = int(sys.argv[1]), int(sys.argv[2]); "
                   "os.dup2(a, 3); os.dup2(b, 4); os.close(a); os.close(b); "
                   "os.execv(sys.argv[3], sys.argv[3:])")

#: The devtools domains whose events say that a page failed to load something or logged an error.
WATCHED_DOMAINS = ("Page", "Network", "Log", "Runtime", "Audits")


class BrowserError(RuntimeError):
    """The browser did not answer in time, answered with an error, or went away."""


class BrowserUnavailable(BrowserError):
    """No browser could be found or started here: a reason to skip, not a failure."""


def find_chromium() -> str | None:
    """The path of a Chromium or Chrome executable, or None: the DOCTOR_CHROMIUM environment
    variable (a name on PATH or a path) when it is set, else the first of CANDIDATES on PATH."""
    chosen = os.environ.get("DOCTOR_CHROMIUM")
    if chosen:
        return shutil.which(chosen)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageLog:
    """What a page did that a self-contained report must not do; each entry says what and where."""

    failed: list[str] = field(default_factory=list)
    remote: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)  # request id -> its URL

    def problems(self) -> list[str]:
        """Every failed or blocked load, request off the machine and console error."""
        return ([f"failed load: {f}" for f in self.failed]
                + [f"request off the machine: {r}" for r in self.remote]
                + [f"console: {e}" for e in self.errors])

    def note(self, event: dict[str, Any]) -> None:
        """Keep what ``event`` says if it is a failed load, a remote request or an error."""
        method, params = event.get("method", ""), event.get("params", {})
        if method == "Network.loadingFailed":
            why = params.get("blockedReason") or params.get("errorText") or "failed"
            url = self.urls.get(params.get("requestId", ""), "an unknown URL")
            self.failed.append(f"{url}: {why}")
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            self.urls[params.get("requestId", "")] = url
            if not url.startswith(LOCAL_SCHEMES):
                self.remote.append(url)
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            if entry.get("level") in ("error", "warning") or entry.get("source") in (
                    "security", "violation", "network"):
                self.errors.append(f"[{entry.get('source')}/{entry.get('level')}] "
                                   f"{entry.get('text')} {entry.get('url', '')}".rstrip())
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning",
                                                                               "assert"):
            words = " ".join(str(a.get("value", a.get("description", "")))
                             for a in params.get("args", []))
            self.errors.append(f"[console.{params.get('type')}] {words}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            thrown = details.get("exception", {}).get("description", "")
            self.errors.append(f"[exception] {details.get('text')} {thrown}".rstrip())
        elif method == "Audits.issueAdded":
            issue = params.get("issue", {})
            self.errors.append(f"[issue] {issue.get('code')} "
                               f"{json.dumps(issue.get('details', {}), sort_keys=True)}")


class Browser:
    """One headless Chromium and the pipe to it; close() (or leaving ``with``) kills it."""

    def __init__(self, executable: str, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        self._taken: set[int] = set()
        self._home = Path(tempfile.mkdtemp(prefix="doctor-chromium-"))
        self._stderr = (self._home / "stderr.log").open("wb")
        to_browser, from_browser = os.pipe(), os.pipe()
        # The browser's ends are copied to 10 and up, where moving them to 3 and 4 cannot
        # overwrite one with the other.
        theirs = (_above_ten(to_browser[0]), _above_ten(from_browser[1]))
        os.close(to_browser[0])
        os.close(from_browser[1])
        self._out, self._in = to_browser[1], from_browser[0]
        command = [sys.executable, "-c", MOVE_TO_3_AND_4, *map(str, theirs), executable, *FLAGS,
                   f"--user-data-dir={self._home / 'profile'}", "about:blank"]
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr,
                pass_fds=theirs, start_new_session=True)
        except OSError as err:
            self._proc = None
            self.close()
            raise BrowserUnavailable(f"could not start {executable}: {err}") from err
        finally:
            for fd in theirs:
                os.close(fd)
        try:
            self.version = self.send("Browser.getVersion")
        except BrowserError as err:
            self.close()
            raise BrowserUnavailable(f"{executable} started but did not answer: {err}") from err

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        """Send one command and wait for its reply; the reply's result, or BrowserError."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while data:
            if not _ready(self._out, deadline, writable=True):
                raise BrowserError(f"{method}: the browser takes no more commands{self._tail()}")
            try:
                data = data[os.write(self._out, data):]
            except OSError as err:
                gone = f"{method}: the browser went away ({err}){self._tail()}"
                raise BrowserError(gone) from err
        wanted = self._next_id
        while True:
            reply = self._next(deadline, method)
            if reply.get("id") == wanted:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            if "method" in reply:
                self._events.append(reply)

    def wait_event(self, method: str, session: str | None = None,
                   timeout_s: float | None = None) -> dict[str, Any]:
        """The params of the first event named ``method`` (of ``session``) that no earlier call
        returned; BrowserError at the deadline."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        start = 0
        while True:
            for index in range(start, len(self._events)):
                event = self._events[index]
                if (index not in self._taken and event.get("method") == method
                        and event.get("sessionId") == session):
                    self._taken.add(index)
                    return dict(event.get("params", {}))
            start = len(self._events)
            self._events.append(self._next(deadline, method))

    def drain(self, quiet_s: float = 0.3) -> None:
        """Read the events that arrive until the pipe has been quiet for ``quiet_s``."""
        while (event := self._receive(time.monotonic() + quiet_s, "events")) is not None:
            self._events.append(event)

    def events(self, session: str | None = None) -> list[dict[str, Any]]:
        """Every event received so far (of ``session``), oldest first."""
        return [e for e in self._events if e.get("sessionId") == session]

    def open(self, url: str, width: int = 1280, height: int = 900) -> Page:
        """A new tab with a ``width`` x ``height`` window, with ``url`` loaded in it."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"]
        page = Page(self, target, session)
        for domain in WATCHED_DOMAINS:
            self.send(f"{domain}.enable", session=session)
        page.set_width(width, height)
        navigated = self.send("Page.navigate", {"url": url}, session=session)
        if navigated.get("errorText"):
            raise BrowserError(f"{url}: {navigated['errorText']}")
        self.wait_event("Page.loadEventFired", session=session)
        return page

    def close(self) -> None:
        """Ask the browser to quit, then kill its process group, and remove its profile."""
        proc, self._proc = getattr(self, "_proc", None), None
        if proc is not None:
            try:
                self._next_id += 1
                os.write(self._out, json.dumps({"id": self._next_id,
                                                "method": "Browser.close"}).encode() + b"\0")
                proc.wait(timeout=min(self.timeout_s, 2.0))
            except (OSError, subprocess.TimeoutExpired):
                pass  # it is killed below either way
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # the group has gone already
            proc.wait(timeout=10)
        for fd in ("_out", "_in"):
            if getattr(self, fd, -1) >= 0:
                os.close(getattr(self, fd))
                setattr(self, fd, -1)
        self._stderr.close()
        shutil.rmtree(self._home, ignore_errors=True)

    def _next(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        message = self._receive(deadline, waiting_for)
        if message is None:
            raise BrowserError(f"{waiting_for}: no answer from the browser in time{self._tail()}")
        return message

    def _receive(self, deadline: float, waiting_for: str) -> dict[str, Any] | None:
        """The next message from the browser, or None if none came before ``deadline``."""
        while b"\0" not in self._buffer:
            if not _ready(self._in, deadline):
                return None
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise BrowserError(f"{waiting_for}: the browser closed its pipe{self._tail()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(message))

    def _tail(self) -> str:
        self._stderr.flush()
        tail = (self._home / "stderr.log").read_bytes()[-800:].decode(errors="replace").strip()
        return f"; its last words: {tail}" if tail else ""


class Page:
    """One tab of a Browser, attached with a flat session."""

    def __init__(self, browser: Browser, target: str, session: str) -> None:
        self.browser = browser
        self.target = target
        self.session = session

    def close(self) -> None:
        """Close the tab."""
        self.browser.send("Target.closeTarget", {"targetId": self.target})

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A command to this tab."""
        return self.browser.send(method, params, session=self.session)

    def set_width(self, width: int, height: int = 900) -> None:
        """Make the window ``width`` CSS pixels wide (and ``height`` high), at scale 1."""
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited, returned by value). The
        page's Content-Security-Policy does not apply: devtools runs it, not the page."""
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                               "awaitPromise": True})
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            raise BrowserError(f"evaluate: {details.get('exception', {}).get('description')}"
                               f" ({details.get('text')})")
        return reply["result"].get("value")

    def emulate_media(self, media: str) -> None:
        """Lay the page out for ``media`` ("print", "screen", or "" for the default)."""
        self.send("Emulation.setEmulatedMedia", {"media": media})

    def pdf(self) -> bytes:
        """The page printed to PDF (A4, the browser's default margins), as bytes."""
        reply = self.browser.send("Page.printToPDF", {"paperWidth": 8.27, "paperHeight": 11.69,
                                                      "printBackground": True},
                                  session=self.session, timeout_s=self.browser.timeout_s * 2)
        return base64.b64decode(reply["data"])

    def log(self) -> PageLog:
        """The failed loads, remote requests and errors of this tab so far."""
        self.browser.drain()
        log = PageLog()
        for event in self.browser.events(self.session):
            log.note(event)
        return log


def _ready(fd: int, deadline: float, writable: bool = False) -> bool:
    """Whether ``fd`` can be read (or written) without blocking, waiting until ``deadline``."""
    left = max(deadline - time.monotonic(), 0)
    wanted = ([], [fd]) if writable else ([fd], [])
    return any(select.select(*wanted, [], left))


def _above_ten(fd: int) -> int:
    """A copy of ``fd`` numbered 10 or more (closed on exec unless passed on)."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
