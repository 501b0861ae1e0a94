"""What the verdict says about the run itself: which probes ran (and why the others did not),
the job's details, and the notes on how the job ran and what the figures rest on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from doctor.analyse.parallelism import Parallelism
from doctor.analyse.stages import JobFacts
from doctor.analyse.steps import WINDOW, RankSteps, boundaries_seen
from doctor.command import bootstrap_blockers
from doctor.probes import JOB, probes_of
from doctor.probes.stack_plan import ENV_STACKS, RATE_HZ
from doctor.record.guard import GUARD_HINT
from doctor.record.window import STEPPED_ASIDE
from doctor.store.process_rows import of_processes, process_labels
from doctor.store.rundata import TRACE, RunData
from doctor.verdict import Fix, ProbeStatus

NO_WINDOW_HINT = "run 15 steps or more, or set --window START,STEPS"
#: Job-side probes newer than run directories still read: a process whose statuses lack one
#: was recorded by a doctor without it, and the probe table leaves it out (as it does where no
#: process recorded any status: the others say why).
PROBES_SINCE = ("gc", "checkpoints")
TRACE_HAS_NO_LOADER = "a trace has no view of the loading code"


def probe_table(run: RunData, ranks: dict[int, RankSteps],
                window_problems: dict[int, str]) -> dict[str, ProbeStatus]:
    """Every probe: whether it ran, and if not why, with what to do."""
    if run.record.kind == TRACE:
        bad = run.window_status[~run.window_status["ok"]]
        return {"trace": ProbeStatus(True) if bad.empty or len(bad) < len(run.window_status)
                else ProbeStatus(False, str(bad["reason"].iloc[0]))}
    probes: dict[str, ProbeStatus] = {}
    errors = run.record.bootstrap_errors
    if errors:
        probes["bootstrap"] = ProbeStatus(
            False, f"{len(errors)} process(es) could not start doctor: {errors[0]}",
            "is doctor installed in the Python that runs the job?")
    first = min(ranks.values(), key=lambda r: r.rank) if ranks else None
    mine = run.rows("probe_status", first.process) if first else _main_status(run)
    for spec in probes_of(JOB):
        row = mine[mine["probe"] == spec.name]
        if not row.empty:
            probes[spec.name] = ProbeStatus(bool(row["ok"].iloc[0]), str(row["reason"].iloc[0]),
                                            str(row["hint"].iloc[0]))
        elif spec.name in PROBES_SINCE and (not mine.empty or run.probe_status.empty):
            continue  # recorded by a doctor that had no such probe, or nothing recorded (the
            # probes above say why): none to speak of
        else:
            probes[spec.name] = (ProbeStatus(False, "no status recorded") if ranks
                                 else _not_started(run))
    if first is not None and probes["dataloader"].ok and not _iterated_a_loader(run, first):
        probes["dataloader"] = ProbeStatus(True, "no DataLoader was iterated")
    if ranks:
        windows = [window_status(run, r, window_problems.get(rank))
                   for rank, r in ranks.items()]
        failed = [s for s in windows if not s.ok]
        probes["torch_ops"] = failed[0] if failed else ProbeStatus(True)
    probes.update(run.record.probes)
    # a failure a guard swallowed in any process of the job (doctor.record.guard; the first
    # rank's own first), said where the probe is otherwise fine
    swallowed = run.probe_status[run.probe_status["hint"] == GUARD_HINT]
    for name, reason in zip(swallowed["probe"], swallowed["reason"], strict=True):
        status = probes.get(name)
        if status is not None and status.ok and status.hint != GUARD_HINT:
            probes[name] = ProbeStatus(True, str(reason), GUARD_HINT)
    stacks = probes.get("stacks")
    if ranks and stacks is not None and stacks.ok and run.stack_spans.empty:
        opened = _window_opened(run, ranks)
        probes["stacks"] = ProbeStatus(False, stacks_reason(run, ranks),
                                       stacks.hint if opened and stacks.hint else
                                       "" if opened else NO_WINDOW_HINT)
    return probes


def _window_opened(run: RunData, ranks: dict[int, RankSteps]) -> bool:
    """Whether any rank's profiler window opened (so stacks were due)."""
    procs = of_processes(run.processes, (r.process for r in ranks.values()))
    return bool(procs["window_state"].notna().any()) if "window_state" in procs else False


def _main_status(run: RunData) -> pd.DataFrame:
    """The probe statuses of the job's first main process, where no rank has steps (a job of
    0 or 1 steps still started its probes)."""
    status = run.probe_status
    if status.empty:
        return status
    procs = run.processes[~run.processes["role"].astype(str).str.startswith("worker")]
    for node, rank, pid in zip(procs["node"], procs["rank"], procs["pid"], strict=True):
        rows = run.rows("probe_status", (int(node), int(rank), int(pid)))
        if not rows.empty:
            return rows
    return status.iloc[0:0]


def _not_started(run: RunData) -> ProbeStatus:
    """Why a job-side probe has no status, where no rank has steps."""
    if run.processes.empty:
        hint = ("run the job's Python without -I, -E or -S" if bootstrap_blockers(run.record.argv)
                else "")
        return ProbeStatus(False, nothing_recorded(run), hint)
    return ProbeStatus(False, "torch was never imported by the job")


def _iterated_a_loader(run: RunData, main: RankSteps) -> bool:
    return not run.rows("loaders", main.process).empty


def window_status(run: RunData, main: RankSteps, problem: str | None) -> ProbeStatus:
    """Whether the rank's profiler window gave its split, and if not why."""
    proc = run.rows("processes", main.process).iloc[0]
    read = run.rows("window_status", main.process)
    state = proc["window_state"]
    if state is None or pd.isna(state):
        own = run.rows("probe_status", main.process)
        own = own[own["probe"] == "torch_ops"]
        if not own.empty and not bool(own["ok"].iloc[0]):
            return ProbeStatus(False, str(own["reason"].iloc[0]), str(own["hint"].iloc[0]))
        if main.kind != WINDOW:
            return ProbeStatus(False, "the job ended before the profiler window opened",
                               NO_WINDOW_HINT)
    if state == "failed":
        reason = str(proc["window_reason"])
        if reason in STEPPED_ASIDE:  # closed by choice, not broken
            return ProbeStatus(False, f"no torch.profiler window: {reason}",
                               "the verdict uses step timings and stack samples")
        return ProbeStatus(False, f"torch.profiler failed: {reason}",
                           "the verdict uses step timings only")
    if read.empty:
        return ProbeStatus(False, "the job ended inside the profiler window",
                           "run more steps, or move the window with --window START,STEPS")
    if not bool(read["ok"].iloc[0]):
        return ProbeStatus(False, str(read["reason"].iloc[0]))
    if problem:
        return ProbeStatus(False, problem)
    return ProbeStatus(True)


def stacks_reason(run: RunData, ranks: dict[int, RankSteps]) -> str:
    """Why no stack samples split the input wait ('' when some did)."""
    if run.record.kind == TRACE:
        return TRACE_HAS_NO_LOADER
    status = run.record.probes.get("stacks")
    if status is not None and not status.ok:
        return status.reason or "the stacks probe did not run"
    if of_processes(run.stack_spans, (r.process for r in ranks.values())).empty:
        if _window_opened(run, ranks):
            said = status.reason if status is not None and status.reason else ""
            return ("no stack samples were taken in the profiler window"
                    + (f" ({said})" if said else ": py-spy wrote none"))
        window = of_processes(run.probe_status, (r.process for r in ranks.values()))
        off = window[(window["probe"] == "torch_ops") & ~window["ok"]]
        why = str(off["reason"].iloc[0]) if not off.empty else \
            "the job ended before the profiling window"
        return f"no stack samples were taken: {why}"
    return ""


def job_dict(run: RunData, job: JobFacts, parallelism: Parallelism | None = None
             ) -> dict[str, Any]:
    """The job's details for the verdict (what is not known is left out); ``parallelism``: what
    its collectives serve, in words."""
    r = run.record
    out: dict[str, Any] = {
        "argv": list(r.argv), "exit_code": r.exit_code, "ranks": job.ranks,
        "world_size": job.world_size, "device": job.device, "host": r.host,
        "cores": job.cores, "torch_version": job.torch_version, "python": r.python,
        "started": r.started, "duration_s": r.duration_s,
    }
    if len(r.nodes) > 1:
        out["nodes"] = list(r.nodes)
    if job.autocast:  # the autocasts the training processes entered (doctor.probes.amp)
        out["autocast"] = [f"{device}:{dtype}" for device, dtype in job.autocast]
    if parallelism is not None and parallelism.describe():
        out["parallelism"] = parallelism.describe()
        out["parallel_kinds"] = list(parallelism.kinds)
    if not run.window_status.empty:  # which decoder and gunzip read the traces
        from doctor.trace.reader import GUNZIP
        from doctor.trace.scan import READER

        out["trace_reader"] = READER
        out["trace_gunzip"] = GUNZIP
    return {k: v for k, v in out.items() if v is not None or k == "exit_code"}


def exit_notes(run: RunData) -> tuple[bool, list[str]]:
    """(whether the figures are partial, why): a job that did not end well, or records that
    could not be read."""
    r = run.record
    read = [f"Not read: {p}." for p in r.problems]
    partial, notes = _exit_notes(run)
    return partial or bool(read), [*notes, *read]


def _exit_notes(run: RunData) -> tuple[bool, list[str]]:
    r = run.record
    if not r.job_seen:
        return False, []
    if r.exit_code is None:
        return True, ["doctor did not see the job end: the verdict covers what was recorded."]
    if r.signal:
        return True, [f"The job was stopped by signal {r.signal} (exit status {r.exit_code}): "
                      "the verdict covers the steps it ran."]
    if r.exit_code != 0:
        return True, [f"The job exited with status {r.exit_code}: the verdict covers the steps "
                      "it ran."]
    return False, []


def contention_notes(contention: dict[int, float], cores: int | None) -> list[str]:
    return _contention_note(
        contention, lambda rank, frac: f"With DataLoader workers on {cores} cores, the training "
        f"process of rank {rank} waited for a core the workers held for {frac:.0%} of its step "
        "time outside the input wait; that time counts as input, split by stage like the wait.")


def comm_contention_notes(contention: dict[int, float], cores: int | None) -> list[str]:
    return _contention_note(
        contention, lambda rank, frac: f"On {cores} cores, the training thread of rank {rank} "
        f"waited for a core the communication threads (gloo, NCCL) held for {frac:.0%} of its "
        "step time outside the input wait; that time counts as communication.")


def _contention_note(contention: dict[int, float], words: Callable[[int, float], str]
                     ) -> list[str]:
    """The note of the rank that waited most for a core (rank -> its share), none without."""
    if not contention:
        return []
    rank, frac = max(contention.items(), key=lambda kv: kv[1])
    return [words(rank, frac)]


def trace_notes(run: RunData) -> list[str]:
    """What traces read whole but not analysed whole say of it (doctor.trace.budget)."""
    status = run.window_status
    if status.empty:
        return []
    said = status[status["ok"].astype(bool) & (status["reason"].astype(str) != "")]
    return sorted(set(said["reason"].astype(str)))


def rule_notes(skipped: dict[str, str]) -> list[str]:
    """A rule that failed is said (one that lacked evidence is only listed in the verdict)."""
    return [f"Rule {rule_id} was skipped: {why}." for rule_id, why in sorted(skipped.items())
            if why.startswith("rule failed")]


def no_steps_reason(run: RunData, ranks: dict[int, RankSteps]) -> str:
    """Why there are no steps to analyse."""
    if run.record.kind == TRACE:
        reasons = [r for r in run.window_status["reason"] if r]
        return reasons[0] if reasons else "the steps have no duration"
    if run.processes.empty:
        return nothing_recorded(run)
    if not ranks:
        seen = boundaries_seen(run)
        if seen:
            return (f"the job ran {seen} step{'s' if seen > 1 else ''}: a step is timed from "
                    "one to the next, so doctor needs 2 or more")
        return ("the job's processes recorded no optimizer step, backward() call or DataLoader "
                "batch")
    return "the steps have no duration"


def nothing_recorded(run: RunData) -> str:
    """Why no process of the job recorded anything: Python's options that keep doctor's
    bootstrap out (in the command as run), else the job ran no step (a process records from
    its first step), or no torch."""
    blocked = bootstrap_blockers(run.record.argv)
    if blocked:
        return f"doctor's bootstrap never loaded in the job's Python: {'; '.join(blocked)}"
    return ("no Python process of the job recorded anything: it ran no training step (doctor "
            "records from the first optimizer step, backward() call or DataLoader batch), or "
            "it does not use torch")


def no_steps_fix(run: RunData, ranks: dict[int, RankSteps]) -> Fix | None:
    """The fix for a run with no steps where it is not marking steps (None: mark them)."""
    if run.record.kind == TRACE or ranks:
        return None
    if run.processes.empty and bootstrap_blockers(run.record.argv):
        return Fix(
            title="Run the job's Python without -I, -E or -S",
            why="doctor starts in every process of the job through PYTHONPATH and the site "
                "module (a sitecustomize); those options turn that off, so nothing was "
                "recorded. Without them, or with doctor.watch in the script, it is.",
            code="doctor run python train.py     # not: doctor run python -I train.py\n\n"
                 "# or, keeping the options, in the script:\nimport doctor\n\n"
                 "@doctor.watch\ndef train(): ...")
    if not run.processes.empty and boundaries_seen(run):
        return Fix(
            title="Run more steps",
            why="a step is timed from one to the next and the first few are warm-up: run 15 "
                "steps or more (25 for the profiler window's split of each step)")
    return None


def range_notes(ledger: pd.DataFrame, step_range: tuple[int, int]) -> list[str]:
    first, last = step_range
    count = int(ledger["step"].max()) if len(ledger) else 0
    notes = [f"Only steps {first}-{min(last, count)} of {count} per rank are analysed "
             "(--steps)."]
    sampled = ledger[ledger["sampled"]]
    if not sampled.empty:
        outside = int((~sampled["in_range"]).sum())
        where = f"steps {int(sampled['step'].min())}-{int(sampled['step'].max())}"
        if outside == len(sampled):
            notes.append(f"The input split comes from stack samples taken during {where}, "
                         "outside the range: open the profiler window inside it (doctor run "
                         "--window START,STEPS) to sample there.")
        elif outside:
            notes.append(f"The input split comes from stack samples taken during {where}, "
                         "partly outside the range.")
    return notes


def source_notes(ranks: dict[int, RankSteps], window: pd.DataFrame, split: bool) -> list[str]:
    """What the split of the time outside the input wait rests on."""
    notes = []
    if any(r.kind != WINDOW for r in ranks.values()) and not split:
        notes.append("No torch.profiler window was recorded (the probes say why: a run of "
                     "fewer than 25 steps, the job's own profiler), so compute includes any "
                     "Python between steps (logging, checkpoints).")
    own = of_processes(window, (r.process for r in ranks.values() if r.kind == WINDOW))
    kinds = set(own["boundary"]) - {"profiler_step"}
    if kinds:
        notes.append("no ProfilerStep#N in the trace: steps taken from "
                     + ", ".join(sorted(kinds)).replace("_", " "))
    return notes


def sampling_notes(run: RunData) -> list[str]:
    """Where py-spy sampled a process without pausing it, or at a lower rate for longer: the
    stacks probe's choice for a process with many threads (doctor.probes.stack_plan)."""
    spans = run.stack_spans
    if spans.empty:
        return []
    roles = process_labels(run.processes)
    asked = f"({ENV_STACKS})"  # the recorder of a mode DOCTOR_STACKS chose ends so
    unpaused = [roles.get((int(n), int(p)), f"pid {p}") for n, p, rec in zip(
        spans["node"], spans["pid"], spans["recorder"], strict=True)
        if "nonblocking" in str(rec) and asked not in str(rec)]
    forced = any(str(rec) == f"py-spy nonblocking {asked}" for rec in spans["recorder"])
    slower = sorted({float(r) for r, rec in zip(spans["rate_hz"], spans["recorder"], strict=True)
                     if str(rec) == "py-spy" and float(r) < RATE_HZ})
    notes = []
    if unpaused:
        notes.append(f"Stacks of {', '.join(sorted(unpaused)[:4])} were read without pausing "
                     "the process (py-spy --nonblocking: it runs so many threads that pausing "
                     "them all would slow it): a tight Python loop may be under-counted in the "
                     "split.")
    if forced:
        notes.append("Stacks were read without pausing the processes, as DOCTOR_STACKS asked: "
                     "a tight Python loop may be under-counted in the split.")
    if slower:
        notes.append(f"Some processes were sampled at {slower[0]:.0f} Hz for longer instead of "
                     f"{RATE_HZ} Hz, to keep the pauses of their many threads within "
                     "budget.")
    return notes
