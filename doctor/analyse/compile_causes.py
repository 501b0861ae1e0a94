"""Why torch.compile compiled again and where it broke the graph, for doctor.analyse.compiles:
each recompilation's failed guard (doctor.probes.compile_causes) sorted into a kind of cause
(a size, a dtype, a Python value, ...), grouped with its count and the seconds its
recompilations took; each graph break with its reason, its place in the job's code and how
often Dynamo met it.

The guard texts are Dynamo's own and change between torch versions ("tensor 'x' size mismatch
at index 1. expected 16, actual 24" today; "tensor 'L['x']' size mismatch ..." or
"L['x'].size()[1] == 16" before): the kinds are read from words every version uses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

#: kind -> how a guard of that kind reads; the first that matches names a guard's kind
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("size", re.compile(r"size mismatch|\.size\(\)|\bsize\(|\bnumel\b|\bdim\b|\bs\d+\b|"
                        r"\blen\(|rank mismatch|ndim", re.I)),
    ("dtype", re.compile(r"dtype", re.I)),
    ("device", re.compile(r"device|dispatch key", re.I)),
    ("requires_grad", re.compile(r"requires_grad", re.I)),
    ("layout", re.compile(r"stride|contiguous|layout|storage_offset", re.I)),
    ("mode", re.compile(r"\.training\b|grad_mode|is_grad_enabled|autocast", re.I)),
    ("type", re.compile(r"type_id|type mismatch|expected type|isinstance", re.I)),
    ("object", re.compile(r"obj_id|\bid\(|is not|\bis\b|___check_obj|dict_version|"
                          r"invalidated", re.I)),
    ("value", re.compile(r"==|!=|<=|>=|<|>")),
)
OTHER = "other"
#: what each kind is, in a finding's words
WORDS = {
    "size": "an input's size changed",
    "dtype": "an input's dtype changed",
    "device": "an input's device changed",
    "requires_grad": "an input's requires_grad changed",
    "layout": "an input's strides or layout changed",
    "mode": "the module's train/eval or grad mode changed",
    "type": "an argument's type changed",
    "object": "a different object was passed or an attribute changed",
    "value": "a Python value the code reads changed",
    OTHER: "a guard Dynamo does not explain simply",
}


def guard_kind(reason: str) -> str:
    """The kind of cause of one failed guard (``OTHER`` where no kind's words match)."""
    return next((kind for kind, words in KINDS if words.search(reason)), OTHER)


@dataclass(frozen=True)
class RecompileCause:
    """The recompilations of one process with one kind of cause."""

    kind: str
    count: int  # recompilations made
    seconds: float  # of the recompilations matched to their compile time (0: none matched)
    example: str  # the guard of the first of them, as Dynamo says it
    function: str  # the compiled function of the first of them, its file and first line
    file: str
    line: int
    refused: int = 0  # guard failures past the recompile limit: no compilation, eager instead

    @property
    def words(self) -> str:
        return WORDS.get(self.kind, WORDS[OTHER])


@dataclass(frozen=True)
class GraphBreak:
    """One graph break: its reason and the line of the job's code it happened at."""

    reason: str
    file: str
    line: int
    count: int  # times Dynamo met it while tracing (once per compilation of its frame)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def recompile_causes(rows: pd.DataFrame, seconds: Mapping[tuple[int, int], float]
                     ) -> tuple[RecompileCause, ...]:
    """One process's recompilation rows grouped by kind of cause, most seconds (then most
    recompilations) first; ``seconds``: each (frame, nth) compilation's seconds. Where the
    compilations were timed, a guard failure that no compilation followed (its compilation
    unknown: the frame was past Dynamo's recompile limit) is counted as refused."""
    rows = rows[rows["kind"] == "recompile"]
    timed = bool((rows["nth"] >= 0).any()) if len(rows) else False
    groups: dict[str, list[dict]] = {}
    for row in rows.to_dict("records"):
        groups.setdefault(guard_kind(str(row["reason"])), []).append(row)
    out = []
    for kind, members in groups.items():
        made = [r for r in members if not timed or int(r["nth"]) >= 0]
        first = (made or members)[0]
        out.append(RecompileCause(
            kind=kind, count=len(made),
            seconds=sum(seconds.get((int(r["frame"]), int(r["nth"])), 0.0) for r in made),
            example=str(first["reason"]), function=str(first["function"]),
            file=str(first["file"]), line=int(first["line"]),
            refused=len(members) - len(made)))
    return tuple(sorted(out, key=lambda c: (-c.seconds, -c.count, c.kind)))


def graph_breaks(rows: pd.DataFrame) -> tuple[GraphBreak, ...]:
    """One process's graph breaks, the most met first."""
    rows = rows[rows["kind"] == "break"]
    found = [GraphBreak(reason=str(r["reason"]), file=str(r["file"]), line=int(r["line"]),
                        count=int(r["count"])) for r in rows.to_dict("records")]
    return tuple(sorted(found, key=lambda b: (-b.count, b.where)))
