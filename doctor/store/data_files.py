"""Where the job's data came from, on disk: the parent's scans of the job's descriptors
(``data_files.npz``: per scan, the data files open, the new ones, sockets, TCP connections and
the network namespace's received bytes) and the mounts the data files were on (``mounts.json``:
kind, files seen, their bytes, free space). Written by doctor.probes.open_files through the
host probe; a missing file reads as an empty frame.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from doctor.store.layout import DATA_FILES, MOUNTS

from .safe_files import open_new, write_text_atomic

if TYPE_CHECKING:
    import pandas as pd

#: One row per scan of the job's descriptors (doctor.probes.open_files.SCAN_COLUMNS).
SCAN_COLUMNS = ("t_s", "files_open", "files_new", "sockets", "connections",
                "remote_connections", "rx_lo_bytes", "rx_bytes", "netns_own", "scan_cpu_s")
#: One row per mount the job's data files were on.
#: ``role``: "data" (the data files were on it) or "staging" (a place to copy them to).
MOUNT_TEXT = ("mount_point", "fstype", "source", "kind", "role")
MOUNT_NUMBERS = ("files_seen", "bytes_seen", "dir_files", "dir_bytes", "free_bytes",
                 "total_bytes")


def save_data_files(run_dir: Path, scans: Mapping[str, Any], mounts: list[dict[str, Any]]
                    ) -> None:
    if mounts:
        write_text_atomic(run_dir / MOUNTS, json.dumps(mounts, indent=1))
    if len(scans["t_s"]):
        arrays: dict[str, Any] = {c: np.frombuffer(scans[c], dtype=np.float64)
                                  for c in SCAN_COLUMNS}
        with open_new(run_dir / DATA_FILES) as f:  # whole or absent, never half
            np.savez_compressed(f, **arrays)


def read_scans(run_dir: Path, problems: list[str] | None = None) -> pd.DataFrame:
    """The scans, a column an older run lacks as NaN; empty when absent or unreadable (said)."""
    from .samples import _arrays, _empty, _frame, _say

    z = _arrays(run_dir / DATA_FILES, problems)
    frame = _frame(z, SCAN_COLUMNS, required=("t_s",)) if z is not None else None
    if frame is None:
        if z is not None:
            _say(problems, f"{run_dir / DATA_FILES}: its columns are missing or of unequal "
                           "lengths")
        return _empty(SCAN_COLUMNS)
    return frame


def read_mounts(run_dir: Path, problems: list[str] | None = None) -> pd.DataFrame:
    """The mounts of the job's data files; empty when absent or unreadable (said)."""
    import pandas as pd

    from .readback import Unreadable, as_float, as_str, printable, read_json
    from .samples import _say

    empty = pd.DataFrame({**{c: pd.Series(dtype=object) for c in MOUNT_TEXT},
                          **{c: pd.Series(dtype="float64") for c in MOUNT_NUMBERS}})
    path = run_dir / MOUNTS
    if not os.path.lexists(path):
        return empty
    try:
        rows = read_json(path)
    except Unreadable as err:
        _say(problems, str(err))
        return empty
    kept = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or any(as_str(row.get(c)) is None for c in MOUNT_TEXT):
            continue
        number = {c: as_float(row.get(c)) for c in MOUNT_NUMBERS}
        kept.append({**{c: printable(str(row[c])[:256]) for c in MOUNT_TEXT},
                     **{c: float("nan") if v is None else v for c, v in number.items()}})
    return pd.DataFrame(kept) if kept else empty
