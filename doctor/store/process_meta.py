"""A process folder's meta.json read back (the job's Session writes it, doctor.record.session:
what the process is and what its probes saw), for the analysis, doctor try and the progress line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from doctor.store import layout

from .readback import Unreadable, read_json_dict


def read_meta(proc_dir: Path, problems: list[str] | None = None) -> dict[str, Any]:
    """A process folder's meta.json; {} when it has none (a process killed at birth) or it
    cannot be read (said in ``problems``: what the process was is then unknown)."""
    path = proc_dir / layout.META
    if not os.path.lexists(path):
        return {}
    try:
        return read_json_dict(path)
    except Unreadable as err:
        if problems is not None:
            problems.append(f"{err}: left out")
        return {}
