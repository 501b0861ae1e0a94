"""Where everything lives in a run directory: the one place that names its files.

    RUN_DIR/run.json                   doctor's record of the run (schema FORMAT)
    RUN_DIR/.doctor.lock               held (flock) by the doctor run recording into it
    RUN_DIR/control.jsonl              signals between doctor run and the job (doctor.store.control)
    RUN_DIR/host.npz, gpu.npz          samples taken from outside the job
    RUN_DIR/bootstrap-errors/<pid>.txt processes that could not start doctor
    RUN_DIR/rank-<R>/<role>-<pid>/     one folder per process of the job that recorded anything:
        meta.json                      what the process is (rank, role, torch, loaders, probes)
        <name>.ring                    fixed-size ring buffers (steps, intervals, events)
        stacks.txt, stacks.json        stack samples (py-spy's raw format) and how they were taken
        stacks-<N>.txt, stacks-<N>.json   the same, beside the N-th window (a later one)
        memory.jsonl                   CUDA allocator snapshots
        trace.json[.gz]                the torch.profiler window (the first)
        trace-<N>.json[.gz]            the N-th window, opened when the run slowed down
    RUN_DIR/verdict.json, report.html, timeline.json.gz   the verdict, the report, the timeline
    RUN_DIR/tries/<stamp>/             one doctor try of the run (doctor.store.tries):
        try.json, report.html          what was tried and measured
        <round>-<arm>/                 one attempt: a run directory, and the job's
            stdout.txt, stderr.txt     output (their tails)

A job of several nodes, each recorded by its own ``doctor run --out DIR`` (the same DIR on a
shared filesystem), so that no file is written by two nodes:

    DIR/node-<K>/                      node K's run directory, as above (its rank folders are
                                       named by the job's global rank), and in it
        node.json                      which node of how many it is; whether its own verdict
                                       and report are written
    DIR/.merge-<key>.lock              taken (O_CREAT|O_EXCL) by the one node that merges a
                                       set of node runs (``key`` names the set)
    DIR/nodes.json                     written by that node: which node runs it merged
    DIR/verdict.json, report.html      the whole job's, from every node

The bootstrap's ``sitecustomize`` names ``bootstrap-errors`` itself: it writes there when doctor
cannot be imported at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

#: The run directory format this doctor writes (``schema`` in run.json), and those it reads: /1
#: differs only in how doctor run and the job talked while it ran (no control file), which
#: nothing reads afterwards. A ring written by an older doctor is refused on its own.
FORMAT = "doctor.run/2"
READS = ("doctor.run/1", FORMAT)
#: The format of a multi-node job's nodes.json.
NODES_FORMAT = "doctor.nodes/1"

RUN_RECORD = "run.json"
RUN_LOCK = ".doctor.lock"
CONTROL = "control.jsonl"
HOST = "host.npz"
GPU = "gpu.npz"
GPU_INFO = "gpus.json"
OTHERS = "others.json"  # processes outside the job that took cores (doctor.probes.others)
DATA_FILES = "data_files.npz"  # scans of the job's descriptors (doctor.probes.open_files)
MOUNTS = "mounts.json"  # the mounts under the job's data files (doctor.probes.open_files)
BOOTSTRAP_ERRORS = "bootstrap-errors"
VERDICT = "verdict.json"
REPORT = "report.html"
TIMELINE = "timeline.json.gz"

TRIES = "tries"
TRY_RECORD = "try.json"
STDOUT = "stdout.txt"
STDERR = "stderr.txt"

NODE_RECORD = "node.json"
NODES_RECORD = "nodes.json"

META = "meta.json"
STACKS_TXT = "stacks.txt"
STACKS_JSON = "stacks.json"
MEMORY = "memory.jsonl"
TRACE = "trace.json"
TRACE_GZ = "trace.json.gz"

_PROC_DIR = re.compile(r"^(?P<role>[a-z]+\d*)-(?P<pid>\d+)$")
_LATER_TRACE = re.compile(r"^trace-(?P<n>[2-9]|[1-9]\d+)\.json(\.gz)?$")
_LATER_STACKS = re.compile(r"^stacks-(?P<n>[2-9]|[1-9]\d+)\.json$")
_NODE_DIR = re.compile(r"^node-(?P<node>\d+)$")
NODE_GLOB = "node-*"


def process_dir(run_dir: Path, rank: int, role: str, pid: int) -> Path:
    return run_dir / f"rank-{rank}" / f"{role}-{pid}"


def ring_path(proc_dir: Path, name: str) -> Path:
    return proc_dir / f"{name}.ring"



def process_dirs(run_dir: Path) -> Iterator[tuple[Path, int, str, int]]:
    """(folder, rank, role, pid) of every process folder, in order of rank, then name."""
    for rank_dir in sorted(run_dir.glob("rank-*")):
        if not rank_dir.is_dir():
            continue
        try:
            rank = int(rank_dir.name.split("-", 1)[1])
        except ValueError:
            continue
        for proc_dir in sorted(rank_dir.iterdir()):
            m = _PROC_DIR.match(proc_dir.name)
            if m and proc_dir.is_dir():
                yield proc_dir, rank, m["role"], int(m["pid"])


def pid_of(proc_dir: Path) -> int | None:
    """The pid in a process folder's name (``main-1234``, ``worker0-5678``)."""
    m = _PROC_DIR.match(proc_dir.name)
    return int(m["pid"]) if m else None


def bootstrap_errors(run_dir: Path) -> list[Path]:
    return sorted((run_dir / BOOTSTRAP_ERRORS).glob("*.txt"))


def uncompressed_traces(run_dir: Path) -> list[Path]:
    return sorted([*run_dir.glob(f"rank-*/*/{TRACE}"), *run_dir.glob("rank-*/*/trace-*.json")])


def trace_name(window: int) -> str:
    """The file of a process's ``window``-th profiler window (from 1), uncompressed."""
    return TRACE if window <= 1 else f"trace-{window}.json"


def stacks_names(window: int) -> tuple[str, str]:
    """(samples, their description) of the stacks sampled beside the ``window``-th window."""
    return (STACKS_TXT, STACKS_JSON) if window <= 1 else (f"stacks-{window}.txt",
                                                          f"stacks-{window}.json")


def stack_times_names(window: int) -> tuple[str, str]:
    """(the main thread's samples on a time axis, py-spy's chrome trace they are made from) of
    the stacks sampled beside the ``window``-th window."""
    return (("stack-times.txt", "stacks-trace.json") if window <= 1 else
            (f"stack-times-{window}.txt", f"stacks-trace-{window}.json"))


def later_stacks(proc_dir: Path) -> list[int]:
    """The numbers N of the later windows whose stacks a process folder holds (stacks-N.json)."""
    found = (_LATER_STACKS.match(p.name) for p in proc_dir.glob("stacks-*.json"))
    return sorted(int(m["n"]) for m in found if m)


def later_traces(proc_dir: Path) -> list[tuple[int, Path]]:
    """(N, path) of each later window's trace in a process folder (``trace-N.json[.gz]``; the
    compressed one where both are), in order of N."""
    found: dict[int, Path] = {}
    for path in proc_dir.glob("trace-*.json*"):
        m = _LATER_TRACE.match(path.name)
        if m and (int(m["n"]) not in found or path.name.endswith(".gz")):
            found[int(m["n"])] = path
    return sorted(found.items())


def node_dir(job_dir: Path, node: int) -> Path:
    """Node ``node``'s run directory in a multi-node job's directory."""
    return job_dir / f"node-{node}"


def node_of_dir(path: Path) -> int | None:
    """The node whose folder ``path`` is named as (``node-3``: 3); None for any other name."""
    m = _NODE_DIR.match(path.name)
    return int(m["node"]) if m else None


def node_dirs(job_dir: Path) -> list[tuple[int, Path]]:
    """(node, folder) of every node folder in ``job_dir``, in node order."""
    return sorted((node, path) for path in job_dir.glob(NODE_GLOB)
                  if (node := node_of_dir(path)) is not None and path.is_dir())


def merge_lock(job_dir: Path, key: str) -> Path:
    """The file the merging node creates, for the set of node runs named ``key``."""
    return job_dir / f".merge-{key}.lock"
