"""run.json read back: the one parser of the run record (doctor.job_record builds it,
doctor.store.rundir writes it, stamped with the format). ``read_run_json(run_dir) -> RunJson``.

A run directory of a format this doctor does not read is refused in one line that says what to
do, not read as empty. A run directory may be damaged or edited by hand: each field is taken
only when it has its type (doctor.store.readback's ``as_*``: a field of another type is as good
as absent), and what its readers need to know of a command of another type is kept
(``argv_fault``, ``cwd_fault``): the analysis leaves such an argv out with a note, doctor try
refuses to run it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from doctor.errors import RunDirError, RunFormatError
from doctor.store import layout
from doctor.verdict import ProbeStatus

from .readback import Unreadable, as_dict, as_float, as_int, as_str, read_json

#: What is wrong with run.json's ``argv``: nothing ("": a list of text, or none), a value of
#: another type that is empty ("empty": 0, "", {}, false: doctor try takes it as no command),
#: one that is not ("not a list"), or a list with items that are not text ("not text").
ArgvFault = Literal["", "empty", "not a list", "not text"]


@dataclass(frozen=True)
class RunJson:
    """A run directory's run.json, each field as it was written (doctor.job_record) or, of
    another type, as absent. ``ended``: the record has the job's exit status (written when the
    job ended; of any type: a node whose exit status is damaged has ended all the same)."""

    schema: str
    argv: tuple[str, ...] = ()  # the command, each item as text (str() of one that is not)
    argv_fault: ArgvFault = ""
    name: str = "job"
    cwd: str | None = None
    cwd_fault: bool = False  # a cwd of another type than text
    env: Mapping[str, Any] | None = None  # the job-shaping environment, as recorded
    started: str | None = None  # local time, "%Y-%m-%dT%H:%M:%S%z"
    t0_monotonic_s: float | None = None
    host: str | None = None
    cores: int | None = None  # None: not said, or 0
    memory_bytes: int | None = None  # None: not said, or 0
    doctor_version: str | None = None
    python: str | None = None
    exit_code: int | None = None
    ended: bool = False
    signal: int | None = None
    duration_s: float | None = None
    probes: Mapping[str, ProbeStatus] = field(default_factory=dict)  # the parent's probes
    fd_handoff_s: float | None = None
    peaks: Mapping[str, Any] | None = None
    links: Mapping[str, Any] | None = None
    deaths: tuple[Mapping[str, Any], ...] = ()
    timed_out: bool = False
    mode: str | None = None  # "watch" for doctor.watch's record; None for doctor run's
    sampler_cpu_s: float | None = None

    @classmethod
    def from_dict(cls, record: Any, run_dir: Path) -> RunJson:
        """``record`` read from ``run_dir``'s run.json: RunDirError (RunFormatError for another
        doctor's format), one line, when it is not a run record this doctor reads."""
        path = run_dir / layout.RUN_RECORD
        schema = record.get("schema") if isinstance(record, dict) else None
        if schema not in layout.READS:
            if isinstance(schema, str) and schema.startswith("doctor.run/"):
                raise RunFormatError(
                    f"{run_dir} was recorded in format {schema}; this doctor reads "
                    f"{' and '.join(layout.READS)}: record the job again with this doctor run, "
                    "or report it with the doctor that recorded it")
            raise RunDirError(f"{path} is not a doctor run record (schema {schema!r})")
        argv, cwd, env = record.get("argv"), record.get("cwd"), record.get("env")
        peaks, links, deaths = record.get("peaks"), record.get("links"), record.get("deaths")
        return cls(
            schema=str(schema), argv=tuple(str(a) for a in argv) if isinstance(argv, list) else (),
            argv_fault=_argv_fault(argv), name=str(record.get("name") or "job"),
            cwd=as_str(cwd), cwd_fault=cwd is not None and not isinstance(cwd, str),
            env=env if isinstance(env, dict) else None, started=as_str(record.get("started")),
            t0_monotonic_s=as_float(record.get("t0_monotonic_s")),
            host=as_str(record.get("host")), cores=as_int(record.get("cores")) or None,
            memory_bytes=as_int(record.get("memory_bytes")) or None,
            doctor_version=as_str(record.get("doctor_version")),
            python=as_str(record.get("python")), exit_code=as_int(record.get("exit_code")),
            ended=record.get("exit_code") is not None, signal=as_int(record.get("signal")),
            duration_s=as_float(record.get("duration_s")),
            probes=probe_statuses(record.get("probes")),
            fd_handoff_s=as_float(record.get("fd_handoff_s")),
            peaks=peaks if isinstance(peaks, dict) else None,
            links=links if isinstance(links, dict) else None,
            deaths=tuple(d for d in deaths if isinstance(d, dict))
            if isinstance(deaths, list) else (),
            timed_out=record.get("timed_out") is True, mode=as_str(record.get("mode")),
            sampler_cpu_s=as_float(record.get("sampler_cpu_s")))


def probe_statuses(value: Any) -> dict[str, ProbeStatus]:
    """A record's ``probes`` (name -> ``{"ok", "reason", "hint"}``, doctor.verdict.ProbeStatus),
    each taken when it is an object (``ok`` only when true)."""
    return {str(k): ProbeStatus(v.get("ok") is True, str(v.get("reason") or ""),
                                str(v.get("hint") or ""))
            for k, v in as_dict(value).items() if isinstance(v, dict)}


def _argv_fault(argv: Any) -> ArgvFault:
    if argv is None:
        return ""
    if isinstance(argv, list):
        return "" if all(isinstance(a, str) for a in argv) else "not text"
    return "not a list" if argv else "empty"


def read_run_json(run_dir: Path) -> RunJson:
    """The run record of ``run_dir``, read defensively (doctor.store.readback): RunDirError, one
    line, when it is missing, not a regular file, not a JSON object or of another format."""
    path = run_dir / layout.RUN_RECORD
    if not os.path.lexists(path):
        raise RunDirError(f"{run_dir} is not a doctor run directory (no {layout.RUN_RECORD})")
    try:
        record = read_json(path)
    except Unreadable as err:
        raise RunDirError(f"{err}: not a run record that can be read") from err
    return RunJson.from_dict(record, run_dir)
