"""Which loading stage a stack sample is in: io, decode or preprocess, by the frame rules.

Inside the loading code (below DataLoader ``__next__`` in the main process, below the fetcher in
a worker), each sample is classified by the innermost frame that matches a rule of
``data/input_frames.json``; on one frame the rules on its source line (``call``) come first, so a
read, running or blocked, is io even inside a decoder's ``open``. Unknown frames count as
preprocess. Users add rules for their own libraries with ``DOCTOR_FRAME_RULES=file.json``.

Input built outside a DataLoader (nanoGPT-style ``get_batch()``) is found in the main process's
samples below a function named like a batch builder (``batch_functions`` in the table), outside
the model's forward, backward and optimizer.
"""

from __future__ import annotations

import json
import linecache
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from doctor.categories import INPUT_STAGES
from doctor.errors import FrameRulesError

STAGES = INPUT_STAGES
RULES_PATH = Path(__file__).parent / "data" / "input_frames.json"
ENV_EXTRA_RULES = "DOCTOR_FRAME_RULES"
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")
_SITE = re.compile(r".*/(site|dist)-packages/|.*/lib/python\d+(\.\d+)?/")
_OWN = re.compile(r"(^|/)(doctor/record|doctor/store|probes)/\w+\.py$")  # doctor's bookkeeping
MAIN_SCOPE = re.compile(r"(^|/)torch/utils/data/dataloader\.py$")
WORKER_SCOPE = re.compile(r"(^|/)torch/utils/data/_utils/fetch\.py$")
_COMPUTE = re.compile(r"(^|/)torch/(nn/modules|nn/parallel|autograd|optim|_tensor\.py)")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str  # shortened: the part after site-packages/ for libraries
    line: int
    path: str  # as recorded, to read the source line

    @classmethod
    def parse(cls, text: str) -> Frame:
        m = _FRAME.match(text)
        if not m:
            return cls(text, "", 0, "")
        path = m["file"]
        return cls(m["func"], _SITE.sub("", path), int(m["line"]), path)


@dataclass(frozen=True)
class FrameRule:
    category: str
    file: re.Pattern[str] | None = None
    function: re.Pattern[str] | None = None
    call: re.Pattern[str] | None = None
    within: bool = False  # every frame inside a frame it matches is its category

    def matches(self, frame: Frame) -> bool:
        if self.file is not None and not self.file.search(frame.file):
            return False
        if self.function is not None and not self.function.search(frame.function):
            return False
        if self.call is not None:
            source = linecache.getline(frame.path, frame.line) if frame.path else ""
            if not self.call.search(source):
                return False
        return any(p is not None for p in (self.file, self.function, self.call))


def load_rules(paths: Iterable[Path] | None = None) -> list[FrameRule]:
    """Rules from the extra file named by DOCTOR_FRAME_RULES (first), then the built-in table."""
    if paths is None:
        extra = os.environ.get(ENV_EXTRA_RULES)
        paths = [Path(extra), RULES_PATH] if extra else [RULES_PATH]
    rules: list[FrameRule] = []
    for path in paths:
        rules.extend(_rules_of(Path(path)))
    return rules


def _rules_of(path: Path) -> list[FrameRule]:
    """The rules of one file; FrameRulesError with one line saying what is wrong with it."""
    named = f"{ENV_EXTRA_RULES}={path}" if path != RULES_PATH else str(path)
    try:
        data = json.loads(path.read_text())
        rules = []
        for i, raw in enumerate(data["rules"]):
            if raw["category"] not in STAGES:
                raise FrameRulesError(f"{named}: rule {i + 1} has unknown category "
                                      f"{raw['category']!r} (one of {', '.join(STAGES)})")
            within = raw.get("within", False)
            if not isinstance(within, bool):
                raise FrameRulesError(f"{named}: rule {i + 1} has \"within\": {within!r} "
                                      "(true or false)")
            file, function, call = (re.compile(raw[k]) if k in raw else None
                                    for k in ("file", "function", "call"))
            rules.append(FrameRule(raw["category"], file, function, call, within))
        return rules
    except FrameRulesError:
        raise
    except OSError as err:
        raise FrameRulesError(f"{named}: cannot read it ({err.strerror or err})") from err
    except json.JSONDecodeError as err:
        raise FrameRulesError(f"{named}: not JSON ({err.msg}, line {err.lineno})") from err
    except re.error as err:
        raise FrameRulesError(f"{named}: a pattern is not a regular expression ({err})") from err
    except (KeyError, TypeError) as err:
        raise FrameRulesError(f"{named}: expected {{\"rules\": [{{\"category\": ..., "
                              f"\"file\" | \"function\" | \"call\": ...}}]}} "
                              f"({type(err).__name__}: {err})") from err


@lru_cache(maxsize=1)
def default_rules() -> tuple[FrameRule, ...]:
    return tuple(load_rules())


@lru_cache(maxsize=1)
def batch_functions() -> re.Pattern[str]:
    return re.compile(json.loads(RULES_PATH.read_text())["batch_functions"])


def classify_outside_loader(stack: tuple[str, ...], rules: Iterable[FrameRule] | None = None
                            ) -> tuple[str, str] | None:
    """(stage, function) for a main-process sample inside a batch-building function that runs
    outside a DataLoader and outside forward/backward/optimizer; None otherwise."""
    frames = [Frame.parse(f) for f in stack]
    if any(MAIN_SCOPE.search(f.file) or _COMPUTE.search(f.file) or _OWN.search(f.file)
           for f in frames):
        return None
    pattern = batch_functions()
    root = next((i for i, f in enumerate(frames) if pattern.search(f.function)), None)
    if root is None:
        return None
    ordered = _call_rules_first(default_rules() if rules is None else tuple(rules))
    return _innermost(frames[root:], ordered) or ("preprocess", _label(frames[-1]))


#: A queue's ``get``: the standard library's, multiprocessing's (or a class's own of that name)
_QUEUE_GET = re.compile(r"(^|/)(queue|multiprocessing/queues)\.py$")


def waits_on_queue(stack: tuple[str, ...]) -> bool:
    """A main-thread sample waiting in a queue's ``get`` outside a DataLoader and outside
    forward, backward and the optimizer: the loop waiting for a batch another thread or process
    of the job makes (a loader of its own, MONAI's ThreadDataLoader)."""
    frames = [Frame.parse(f) for f in stack]
    if any(MAIN_SCOPE.search(f.file) or _COMPUTE.search(f.file) or _OWN.search(f.file)
           for f in frames):
        return False
    return any(_QUEUE_GET.search(f.file) and re.search(r"(^|\.)get(_nowait)?$", f.function)
               for f in frames)


def classify_producer(stack: tuple[str, ...], rules: Iterable[FrameRule] | None = None
                      ) -> tuple[str, str]:
    """(stage, function) of a sample of a thread that feeds the loop through a queue: the
    innermost frame a rule matches, else its innermost frame's code as preprocess."""
    frames = [Frame.parse(f) for f in stack]
    ordered = _call_rules_first(default_rules() if rules is None else tuple(rules))
    return _innermost(frames, ordered) or \
        ("preprocess", _label(frames[-1]) if frames else "a queue's producer")


def classify(stack: tuple[str, ...], scope: re.Pattern[str],
             rules: Iterable[FrameRule] | None = None) -> tuple[str, str] | None:
    """(stage, deciding function) for a sample inside the loading scope, None outside it.

    ``stack`` is outermost first. Samples whose innermost frames are doctor's own bookkeeping
    are ("doctor", ...): they are not the job's loading work.
    """
    frames = [Frame.parse(f) for f in stack]
    root = max((i for i, f in enumerate(frames) if scope.search(f.file)), default=-1)
    if root < 0:
        return None
    inner = frames[root + 1:]
    if inner and _OWN.search(inner[-1].file):
        return "doctor", inner[-1].function
    ordered = _call_rules_first(default_rules() if rules is None else tuple(rules))
    found = _innermost([f for f in inner if not _OWN.search(f.file) and not _is_torch_data(f)],
                       ordered)
    if found is not None:
        return found
    user = next((f for f in reversed(inner) if not _is_torch_data(f) and not _OWN.search(f.file)),
                None)
    return "preprocess", _label(user) if user else "collate/fetch"


def is_user_code(frame: Frame) -> bool:
    """A frame of the job's own code: not a library (site-packages), the standard library,
    the interpreter's (``<frozen ...>``) or doctor's own bookkeeping."""
    return bool(frame.path) and not frame.path.startswith("<") and \
        not _SITE.match(frame.path) and not _OWN.search(frame.file)


def _innermost(frames: list[Frame], ordered: tuple[FrameRule, ...]) -> tuple[str, str] | None:
    """(stage, function) of the outermost frame a ``within`` rule matches (a client's call
    claims everything inside it), else of the innermost frame any rule matches; None: none."""
    for frame in frames:
        for rule in ordered:
            if rule.within and rule.matches(frame):
                return rule.category, _label(frame)
    for frame in reversed(frames):
        for rule in ordered:
            if rule.matches(frame):
                return rule.category, _label(frame)
    return None


def _call_rules_first(rules: tuple[FrameRule, ...]) -> tuple[FrameRule, ...]:
    """On one frame, what its source line calls decides before the file it is in: PIL's
    ``fp.read(...)`` is a read (io), its ``decoder.decode(...)`` is decode."""
    return (*(r for r in rules if r.call is not None), *(r for r in rules if r.call is None))


def _is_torch_data(frame: Frame) -> bool:
    return frame.file.startswith("torch/utils/data/") and "collate" not in frame.file


def _label(frame: Frame) -> str:
    return f"{frame.function} ({frame.file}:{frame.line})"
