"""Check a Chrome-trace JSON object as ui.perfetto.dev and chrome://tracing read it.

Perfetto's own trace processor (the ``perfetto`` package) is used when it can start: it fetches
its binary from the network the first time, which this machine and CI do not have, so the format's
required fields are checked here: the JSON object form, each event's phase and its fields, integer
process and thread ids, names for every process and thread that has events, durations that are
not negative, and slices that nest on each thread (a viewer draws a slice that overlaps its
neighbour's end on the wrong row, or drops it).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

NEST_SLACK_US = 0.5  # rounding of ts and dur to 1 ns


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def perfetto_slice_count(path: Path) -> int | None:
    """The slices Perfetto's trace processor reads from ``path``; None where it cannot start."""
    try:
        from perfetto.trace_processor import TraceProcessor  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        tp = TraceProcessor(trace=str(path))
    except Exception:  # its binary could not be fetched (no network)
        return None
    try:
        return int(next(iter(tp.query("select count(*) as n from slice"))).n)
    finally:
        tp.close()


def check(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace's events, after asserting the format; raises AssertionError with the first
    problem."""
    assert isinstance(data, dict) and isinstance(data.get("traceEvents"), list)
    events = data["traceEvents"]
    named_procs, named_threads = set(), set()
    used_threads, used_procs = set(), set()
    for e in events:
        assert e.get("ph") in ("X", "C", "M", "i", "B", "E"), e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        assert isinstance(e.get("name"), str) and e["name"], e
        if e["ph"] == "M":
            assert isinstance(e.get("args"), dict), e
            if e["name"] == "process_name":
                named_procs.add(e["pid"])
            elif e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e.get("ts"), int | float) and e["ts"] >= 0, e
        used_procs.add(e["pid"])
        if e["ph"] == "X":
            assert isinstance(e.get("dur"), int | float) and e["dur"] >= 0, e
            used_threads.add((e["pid"], e["tid"]))
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, int | float) for v in e["args"].values()), e
    assert used_procs <= named_procs, used_procs - named_procs
    assert used_threads <= named_threads, used_threads - named_threads
    _check_nesting(events)
    return events


def _check_nesting(events: list[dict[str, Any]]) -> None:
    by_thread: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append((e["ts"], -e["dur"], e["name"]))
    for thread, slices in by_thread.items():
        open_ends: list[tuple[float, str]] = []
        for ts, neg_dur, name in sorted(slices):
            end = ts - neg_dur
            while open_ends and open_ends[-1][0] <= ts + NEST_SLACK_US:
                open_ends.pop()
            if open_ends:
                parent_end, parent = open_ends[-1]
                assert end <= parent_end + NEST_SLACK_US, (
                    f"{name} [{ts}, {end}] overlaps the end of {parent} ({parent_end}) on "
                    f"{thread}")
            open_ends.append((end, name))


def names(events: list[dict[str, Any]], kind: str) -> dict[tuple[int, int] | int, str]:
    """The process (``process_name``) or thread (``thread_name``) names of a trace."""
    out: dict[tuple[int, int] | int, str] = {}
    for e in events:
        if e["ph"] == "M" and e["name"] == kind:
            out[e["pid"] if kind == "process_name" else (e["pid"], e["tid"])] = e["args"]["name"]
    return out


WINDOW_SLACK_US = 2_000.0  # the clock pair's error, and the window's own start inside a step


def check_run_timeline(run_dir: Path) -> list[dict[str, Any]]:
    """A run's timeline.json.gz: the format (check), every step once per rank, each DataLoader
    worker's fetches on its own track, and the profiler window's events inside the steps the
    window spans. Returns the events."""
    events = check(load(run_dir / "timeline.json.gz"))
    procs, threads = names(events, "process_name"), names(events, "thread_name")
    slices = [e for e in events if e["ph"] == "X"]
    per_rank: dict[str, list[str]] = defaultdict(list)
    window_steps: list[tuple[float, float]] = []
    for e in slices:
        if e["cat"] == "step":
            per_rank[procs[e["pid"]].split(" main")[0]].append(e["name"])
            if "deep window" in e["args"].get("marks", []):
                window_steps.append((e["ts"], e["ts"] + e["dur"]))
    assert all(len(s) == len(set(s)) for s in per_rank.values()), per_rank.keys()
    workers = {pid for pid, name in procs.items() if " worker" in name}
    for pid in workers:
        fetches = [e for e in slices if e["pid"] == pid and e["name"].startswith("fetch")]
        assert fetches, f"no fetch on {procs[pid]}"
        assert {threads[(pid, e["tid"])] for e in fetches} == {"DataLoader worker"}
    window = [e for e in slices if threads[(e["pid"], e["tid"])].startswith("torch.profiler")]
    if window:
        assert window_steps, "window events but no step marked as in the deep window"
        lo = min(s for s, _e in window_steps) - WINDOW_SLACK_US
        hi = max(e for _s, e in window_steps) + WINDOW_SLACK_US
        outside = [e for e in window if e["ts"] < lo or e["ts"] + e["dur"] > hi]
        assert not outside, f"{len(outside)} of {len(window)} window events outside its steps"
    return events


def slices_by_thread(events: list[dict[str, Any]]) -> Counter[str]:
    """How many slices each named thread has."""
    threads = names(events, "thread_name")
    return Counter(threads[(e["pid"], e["tid"])] for e in events if e["ph"] == "X")
