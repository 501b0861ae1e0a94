"""The rows of a RunData's frames that each process of the job recorded: a process named by
(node, rank, pid), its rows, the rows of several, each one's rows in one pass, and its label."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import pandas as pd

Process = tuple[int, int, int]  # (node, rank, pid): one process of the job, on any node


def split_by(frame: pd.DataFrame, *columns: str) -> dict[Any, pd.DataFrame]:
    """The rows of ``frame`` for each value of ``columns`` (a tuple of Python ints and str),
    in one pass."""
    out: dict[Any, pd.DataFrame] = {}
    for key, rows in frame.groupby(list(columns), sort=False):
        out[tuple(v.item() if isinstance(v, np.generic) else v
                  for v in cast(tuple[Any, ...], key))] = rows
    return out


def of_process(frame: pd.DataFrame, process: Process) -> pd.DataFrame:
    """The rows of ``frame`` that one process recorded."""
    node, rank, pid = process
    return frame[(frame["node"] == node) & (frame["rank"] == rank) & (frame["pid"] == pid)]


def of_processes(frame: pd.DataFrame, processes: Iterable[Process]) -> pd.DataFrame:
    """The rows of ``frame`` that the ``processes`` recorded."""
    wanted = set(processes)
    mask = np.fromiter(((int(n), int(r), int(p)) in wanted for n, r, p
                        in zip(frame["node"], frame["rank"], frame["pid"], strict=True)),
                       dtype=bool, count=len(frame))
    return frame[mask]


def process_labels(processes: pd.DataFrame) -> dict[tuple[int, int], str]:
    """(node, pid) -> "rank R role" for each process of the processes frame."""
    return {(int(node), int(pid)): f"rank {rank} {role}" for node, pid, rank, role
            in zip(processes["node"], processes["pid"], processes["rank"], processes["role"],
                   strict=True)}
