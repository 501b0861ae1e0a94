"""Which processes outside the job took the cores (doctor.probes.others), read by the parent from
a /proc of its own making here, and named beside the machine's load in the analysis
(doctor.analyse.machine_load)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from doctor.analyse.machine_load import other_load
from doctor.probes.others import CLOCK_TICKS, SCAN_S, OtherProcesses
from doctor.store.samples import read_others, save_others


def write_stat(proc: Path, pid: int, name: str, cpu_s: float, ppid: int = 1) -> None:
    folder = proc / str(pid)
    folder.mkdir(exist_ok=True)
    ticks = int(cpu_s * CLOCK_TICKS)
    (folder / "stat").write_text(f"{pid} ({name}) S {ppid} 0 0 0 0 0 0 0 0 0 {ticks} 0 0 0\n")


def test_the_busiest_outside_the_job_and_doctor_are_kept(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "self").mkdir()  # not a process
    others = OtherProcesses(proc)
    job, own = 100, os.getpid()
    cpu = {100: 0.0, 200: 0.0, 300: 0.0, 400: 0.0}
    for t in (0.0, SCAN_S):
        write_stat(proc, 100, "python", cpu[100])  # the job's
        write_stat(proc, 200, "make (a build)", cpu[200])  # a name with a space and parens
        write_stat(proc, 300, "idle", cpu[300])
        write_stat(proc, 400, "py-spy", cpu[400], ppid=own)  # doctor's own
        others.sample(t, [job])
        cpu = {100: 5.0, 200: 1.5 * SCAN_S, 300: 0.01, 400: 3.0}
    assert others.rows == [{"t0_s": 0.0, "t1_s": SCAN_S, "pid": 200, "name": "make (a build)",
                            "cores": 1.5}]
    others.sample(SCAN_S + 0.5, [job])  # not due yet: no scan
    assert len(others.rows) == 1
    save_others(tmp_path, others.rows)
    frame = read_others(tmp_path)
    assert list(frame["name"]) == ["make (a build)"] and list(frame["cores"]) == [1.5]


def test_the_load_is_named_by_the_processes_seen() -> None:
    system = pd.DataFrame({"node": 0, "t_s": [0.0, 0.5, 1.0], "cores": 2.0,
                           "busy_cores": [1.0, 2.0, 2.0]})
    host = pd.DataFrame({"node": 0, "pid": 7, "t_s": [0.0, 0.5, 1.0],
                         "cpu_pct": [100.0, 100.0, 100.0]})
    seen = pd.DataFrame({"node": 0, "t0_s": [0.0], "t1_s": [5.0], "pid": [200.0],
                         "cores": [1.0], "name": ["make"]})
    load = other_load(host, system, others=seen)
    assert load is not None
    assert load.words[0] == "other processes kept 1.0 of 2 cores busy: make (pid 200) 1.0 cores"


def test_an_unreadable_list_is_said_and_left_out(tmp_path: Path) -> None:
    (tmp_path / "others.json").write_text("{not json")
    problems: list[str] = []
    assert read_others(tmp_path, problems).empty
    assert problems and "others.json" in problems[0]
