"""Split input-loading time into io, decode and preprocess, from stack samples.

Where loading runs (the main process for num_workers=0, the DataLoader workers otherwise), the
stacks probe samples the process's main thread at a fixed rate, running or blocked, so each
sample stands for the same slice of wall time. Inside the loading code (below DataLoader
``__next__`` in the main process, below the fetcher in a worker), each sample is classified by
the innermost frame that matches a rule of ``data/input_frames.json``; on one frame the rules
on its source line (``call``) come first, so a read, running or blocked, is io even inside a
decoder's ``open``. Unknown frames count as preprocess. The fractions of loading time per stage
are sample counts over the loading samples: no rate or span enters them.

The fractions then split the main process's wait of every step.

Input built outside a DataLoader (nanoGPT-style ``get_batch()``) is found in the main process's
samples below a function named like a batch builder (``batch_functions`` in the table), outside
the model's forward, backward and optimizer; its share of the main thread's samples moves that
much of each step from compute and other to the stage.
"""

from __future__ import annotations

import json
import linecache
import os
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from doctor.categories import INPUT_STAGES
from doctor.errors import FrameRulesError
from doctor.store.rundir import ProcessRecord
from doctor.store.stacks import StackSamples, read_stacks

STAGES = INPUT_STAGES
RULES_PATH = Path(__file__).parent / "data" / "input_frames.json"
ENV_EXTRA_RULES = "DOCTOR_FRAME_RULES"
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")
_SITE = re.compile(r".*/(site|dist)-packages/|.*/lib/python\d+(\.\d+)?/")
_OWN = re.compile(r"(^|/)(doctor|probes)/(session|ringbuffer|dataloader|stacks)\.py$")
_MAIN_SCOPE = re.compile(r"(^|/)torch/utils/data/dataloader\.py$")
_WORKER_SCOPE = re.compile(r"(^|/)torch/utils/data/_utils/fetch\.py$")
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
            rules.append(FrameRule(
                raw["category"],
                *(re.compile(raw[k]) if k in raw else None for k in ("file", "function", "call")),
            ))
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
    if any(_MAIN_SCOPE.search(f.file) or _COMPUTE.search(f.file) or _OWN.search(f.file)
           for f in frames):
        return None
    pattern = batch_functions()
    root = next((i for i, f in enumerate(frames) if pattern.search(f.function)), None)
    if root is None:
        return None
    ordered = _call_rules_first(default_rules() if rules is None else tuple(rules))
    for frame in reversed(frames[root:]):
        for rule in ordered:
            if rule.matches(frame):
                return rule.category, _label(frame)
    return "preprocess", _label(frames[-1])


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
    for frame in reversed(inner):
        if _OWN.search(frame.file) or _is_torch_data(frame):
            continue
        for rule in ordered:
            if rule.matches(frame):
                return rule.category, _label(frame)
    user = next((f for f in reversed(inner) if not _is_torch_data(f) and not _OWN.search(f.file)),
                None)
    return "preprocess", _label(user) if user else "collate/fetch"


def _call_rules_first(rules: tuple[FrameRule, ...]) -> tuple[FrameRule, ...]:
    """On one frame, what its source line calls decides before the file it is in: PIL's
    ``fp.read(...)`` is a read (io), its ``decoder.decode(...)`` is decode."""
    return (*(r for r in rules if r.call is not None), *(r for r in rules if r.call is None))


def _is_torch_data(frame: Frame) -> bool:
    return frame.file.startswith("torch/utils/data/") and "collate" not in frame.file


def _label(frame: Frame) -> str:
    return f"{frame.function} ({frame.file}:{frame.line})"


@dataclass
class StageSplit:
    """Seconds of loading per stage over the sampled spans, and where they went."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    top: defaultdict[tuple[str, str], float] = field(
        default_factory=lambda: defaultdict(float))  # (stage, function) -> seconds
    processes: int = 0
    recorders: set[str] = field(default_factory=set)
    fetch_s: float = 0.0  # over the whole run, in the loading processes
    collate_s: float = 0.0

    @property
    def fractions(self) -> dict[str, float] | None:
        total = sum(self.seconds.values())
        if total <= 0:
            return None
        return {s: v / total for s, v in self.seconds.items()}

    def add(self, samples: StackSamples, scope: re.Pattern[str],
            rules: Iterable[FrameRule] | None = None) -> None:
        """Add one process's samples: each one inside ``scope`` is 1/rate seconds of loading."""
        per_sample = 1.0 / max(samples.rate_hz, 1e-9)
        for stack, count in samples.stacks.items():
            hit = classify(stack, scope, rules)
            if hit is None or hit[0] == "doctor":
                continue
            stage, function = hit
            self.seconds[stage] += count * per_sample
            self.top[(stage, function)] += count * per_sample
        self.processes += 1
        self.recorders.add(samples.recorder)


def outside_loader_shares(samples: StackSamples, rules: Iterable[FrameRule] | None = None
                          ) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """Fractions of the main thread's time spent building input outside a DataLoader, per
    stage, and per (stage, function)."""
    taken = max(1, samples.count)
    shares = dict.fromkeys(STAGES, 0.0)
    top: dict[tuple[str, str], float] = defaultdict(float)
    for stack, count in samples.stacks.items():
        hit = classify_outside_loader(stack, rules)
        if hit is not None:
            shares[hit[0]] += count / taken
            top[hit] += count / taken
    return shares, dict(top)


def workers_of(main: ProcessRecord, procs: list[ProcessRecord]) -> list[ProcessRecord]:
    """The DataLoader workers that ``main`` started."""
    return [p for p in procs if p.rank == main.rank and p.role.startswith("worker")
            and p.meta.get("ppid") == main.pid]


def rank_split(main: ProcessRecord, procs: list[ProcessRecord],
               rules: Iterable[FrameRule] | None = None) -> StageSplit:
    """Where rank ``main``'s loading work went: in the main process or in its workers."""
    loaders: list[dict[str, Any]] = main.meta.get("loaders", [])
    workers = int(loaders[0].get("num_workers", 0)) if loaders else 0
    split = StageSplit()
    loading = [main] if workers == 0 else workers_of(main, procs)
    for proc in loading:
        split.fetch_s += _total_seconds(proc, "fetch")
        split.collate_s += _total_seconds(proc, "collate")
    scope = _MAIN_SCOPE if workers == 0 else _WORKER_SCOPE
    for proc in loading:
        samples = read_stacks(proc.path)
        if samples is not None:
            split.add(samples, scope, rules)
    return split


def _total_seconds(proc: ProcessRecord, ring: str) -> float:
    from doctor.analyse.ledger import read_intervals

    t0, t1, _ = read_intervals(proc, ring)
    return float((t1 - t0).sum()) * 1e-9
