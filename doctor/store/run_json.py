"""run.json read back: the one parser of the run record (doctor.job_record builds it,
doctor.store.rundir writes it, stamped with the format). A run directory of a format this doctor
does not read is refused in one line that says what to do, not read as empty.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from doctor.errors import RunDirError, RunFormatError
from doctor.store import layout

from .readback import Unreadable, read_json


def read_run_record(run_dir: Path) -> dict[str, Any]:
    """The run record of ``run_dir``, read defensively (doctor.store.readback): RunDirError, one
    line, when it is missing, not a regular file, not a JSON object or of another format."""
    path = run_dir / layout.RUN_RECORD
    if not os.path.lexists(path):
        raise RunDirError(f"{run_dir} is not a doctor run directory (no {layout.RUN_RECORD})")
    try:
        record = read_json(path)
    except Unreadable as err:
        raise RunDirError(f"{err}: not a run record that can be read") from err
    schema = record.get("schema") if isinstance(record, dict) else None
    if schema not in layout.READS:
        if isinstance(schema, str) and schema.startswith("doctor.run/"):
            raise RunFormatError(
                f"{run_dir} was recorded in format {schema}; this doctor reads "
                f"{' and '.join(layout.READS)}: record the job again with this doctor run, or "
                "report it with the doctor that recorded it")
        raise RunDirError(f"{path} is not a doctor run record (schema {schema!r})")
    return dict(record)
