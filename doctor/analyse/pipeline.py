"""From a run directory to an Analysis: ledger, rules, verdict. Reads only; writes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from doctor import rules as _rules  # noqa: F401  (registers the rules)
from doctor.analyse.distributed import rank_table
from doctor.analyse.ledger import (
    RankSteps,
    build_ledger,
    main_process,
    rank_steps,
)
from doctor.analyse.split import (
    STAGES,
    StageSplit,
    outside_loader_shares,
    rank_split,
    workers_of,
)
from doctor.analyse.window import WindowUnavailable, window_fractions, window_frame
from doctor.errors import UsageError
from doctor.rules.base import RuleInputs, run_rules
from doctor.store.layout import bootstrap_errors
from doctor.store.rundir import ProcessRecord, list_processes, read_run_record
from doctor.store.samples import read_host, read_memory
from doctor.store.stacks import read_stacks
from doctor.verdict import BOTTLENECKS, CATEGORIES, Analysis, Finding, Fix, ProbeStatus, Verdict

FEW_STEPS = 20


def analyze_run(run_dirs: Path | Sequence[Path],
                steps: tuple[int | None, int | None] | None = None) -> Analysis:
    """Analyse one run directory, or several (one per node of a multi-node job) as one job.

    ``steps`` (first, last), 1-based, inclusive, either open (None), analyses only the steps in
    that range (the ledger keeps the others), and only the host samples of their span: e.g. to
    leave an evaluation phase out. The input split comes from the stack samples wherever they
    were taken; a note says when that was outside the range."""
    dirs = [run_dirs] if isinstance(run_dirs, Path) else list(run_dirs)
    records = [read_run_record(d) for d in dirs]
    record = _merged_record(records)
    procs = [p for d in dirs for p in list_processes(d)]
    mains = main_process(procs)
    notes: list[str] = []

    ranks: list[RankSteps] = [rank_steps(p) for _, p in sorted(mains.items())]
    fractions: dict[int, dict[str, float]] = {}
    window_status: dict[int, ProbeStatus] = {}
    frames: list[pd.DataFrame] = []
    for rank, proc in sorted(mains.items()):
        window_status[rank] = _window_status(proc)
        if proc.trace is not None:
            try:
                frame = window_frame(proc.trace, rank)
                fractions[rank] = window_fractions(frame)
                frames.append(frame)
            except WindowUnavailable as err:
                window_status[rank] = ProbeStatus(False, f"trace unreadable: {err}")
    gpu_steps = pd.concat(frames, ignore_index=True) if frames else None
    splits = {rank: rank_split(proc, procs) for rank, proc in mains.items()}
    input_split = {rank: f for rank, s in splits.items() if (f := s.fractions) is not None}
    outside = _outside_loader(mains, splits)
    t0 = _rank_t0(dirs, records, mains)
    step_range = _step_range(steps, ranks)
    ledger = build_ledger(ranks, t0, fractions, input_split, outside, step_range=step_range)

    host, system = _load_host(dirs)
    main_meta = mains[min(mains)].meta if mains else {}
    meta = _job_meta(record, main_meta, mains, procs, host)
    loaders = pd.DataFrame(main_meta.get("loaders", []))
    if not loaders.empty:
        counts = main_meta.get("batch_tensors") or {}
        loaders["batch_tensors"] = [counts.get(str(i)) for i in loaders["id"]]
    meta["fd_handoff_s"] = record.get("fd_handoff_s")
    meta["window_fractions"] = bool(fractions)
    if mains and not fractions:
        notes.append("No torch.profiler window was recorded, so compute includes any Python "
                     "between steps (logging, checkpoints): run 25 steps or more for the split.")

    if not loaders.empty:
        meta["loader"] = {str(k): v for k, v in loaders.iloc[0].to_dict().items()}
    meta["input_split"] = _split_evidence(splits)
    steady = _analysed(ledger)
    span = ((float(steady["start_s"].min()), float((steady["start_s"] + steady["wall_s"]).max()))
            if not steady.empty else None)
    if step_range is not None:
        host, system = _within(host, span), _within(system, span)
        notes.extend(_range_notes(ledger, step_range))
    contention = _loading_contention(host, system, ledger, mains, procs, span)
    if contention:
        ledger = build_ledger(ranks, t0, fractions, input_split, outside, contention,
                              step_range)
        rank, frac = max(contention.items(), key=lambda kv: kv[1])
        notes.append(f"With DataLoader workers on {meta.get('cores')} cores, the training "
                     f"process of rank {rank} waited for a core the workers held for "
                     f"{frac:.0%} of its step time outside the input wait; that time counts as "
                     "input, split by stage like the wait.")
    meta["main_cpu_cores"] = _cores_used(host, meta["main_pids"], span)
    meta["worker_cpu_cores"] = _cores_used(host, meta["worker_pids"], span, total=True)
    meta["outside_loader"] = _outside_evidence(outside, splits)
    meta["stacks_reason"] = _stacks_reason(record, mains)
    memory = read_memory({p.pid: p.path for p in mains.values()})
    inputs = RuleInputs(ledger=_analysed(ledger), host=host, system=system,
                        gpu_steps=gpu_steps, memory=memory, loaders=loaders, meta=meta)
    outcome = run_rules(inputs)
    findings = list(outcome.findings)

    verdict_steps, shares, bottleneck = _summarise(ledger, notes, findings, procs)
    probes = _probe_table(record, main_meta, window_status, dirs, mains)
    exit_code = record.get("exit_code")
    partial = exit_code is None or exit_code != 0
    if exit_code is None:
        notes.append("doctor did not see the job end: the verdict covers what was recorded.")
    elif record.get("signal"):
        notes.append(f"The job was stopped by signal {record['signal']} (exit status "
                     f"{exit_code}): the verdict covers the steps it ran.")
    elif exit_code != 0:
        notes.append(f"The job exited with status {exit_code}: the verdict covers the steps it "
                     "ran.")
    for rule_id, why in sorted(outcome.skipped.items()):
        if why.startswith("rule failed"):
            notes.append(f"Rule {rule_id} was skipped: {why}.")
    verdict = Verdict(
        bottleneck=bottleneck, shares=shares, steps=verdict_steps, findings=findings,
        probes=probes, job=_job_dict(record, meta), partial=partial, notes=notes,
        extra={"rules_skipped": outcome.skipped},
    )
    tables: dict[str, pd.DataFrame] = {}
    top = _top_functions(splits)
    if not top.empty:
        tables["top_functions"] = top
    ranks_table = rank_table(ledger, gpu_steps)
    if not ranks_table.empty:
        tables["ranks"] = ranks_table
    notes.extend(_crash_notes(procs))
    if not loaders.empty:
        tables["loaders"] = loaders
    processes = _process_table(host, procs)
    if not processes.empty:
        tables["processes"] = processes
    source = ", ".join(str(d) for d in dirs)
    return Analysis(verdict=verdict, ledger=ledger, source=source, tables=tables)


def _merged_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One node's record stands for the job; the exit status is the first failure's."""
    record = dict(records[0])
    codes = [r.get("exit_code") for r in records]
    failed = [r for r, c in zip(records, codes, strict=True) if c is None or c != 0]
    if failed:
        record["exit_code"] = failed[0].get("exit_code")
        record["signal"] = failed[0].get("signal")
    if len(records) > 1:
        record["nodes"] = [r.get("host") for r in records]
    return record


def _rank_t0(dirs: list[Path], records: list[dict[str, Any]],
             mains: dict[int, ProcessRecord]) -> dict[int, int]:
    """Each rank's time origin: the start of the ``doctor run`` on its own node (clocks of
    different machines are not comparable)."""
    t0_of_dir = {d.resolve(): int(float(r.get("t0_monotonic_s", 0.0)) * 1e9)
                 for d, r in zip(dirs, records, strict=True)}
    out = {}
    for rank, proc in mains.items():
        node_dir = proc.path.parent.parent.resolve()
        out[rank] = t0_of_dir.get(node_dir, 0)
    return out


def _load_host(dirs: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    loaded = [read_host(d) for d in dirs]
    if len(loaded) == 1:
        return loaded[0]
    return (pd.concat([h for h, _ in loaded], ignore_index=True),
            pd.concat([s for _, s in loaded], ignore_index=True))


def _analysed(ledger: pd.DataFrame) -> pd.DataFrame:
    """The analysed steps, or every step of the range when too few to leave warm-up out."""
    analysed = ledger[ledger["analyzed"]]
    return analysed if not analysed.empty else ledger[ledger["in_range"]]


def _step_range(steps: tuple[int | None, int | None] | None, ranks: list[RankSteps]
                ) -> tuple[int, int] | None:
    """``steps`` with its open ends closed; UsageError when no rank has a step in it."""
    if steps is None or steps == (None, None):
        return None
    most = max((len(r.ends_ns) for r in ranks), default=0)
    first, last = steps[0] or 1, steps[1] or most
    if first > most:
        raise UsageError(f"--steps from step {first}: the run has {most} steps per rank")
    if first < 1 or last < first:
        raise UsageError(f"--steps {first}:{last} is not a range of steps (first:last, from 1)")
    return first, last


def _within(frame: pd.DataFrame, span: tuple[float, float] | None) -> pd.DataFrame:
    """The host or machine samples taken during ``span`` (seconds, the ledger's clock)."""
    if span is None or frame.empty or "t_s" not in frame:
        return frame
    return frame[(frame["t_s"] >= span[0]) & (frame["t_s"] <= span[1])]


def _range_notes(ledger: pd.DataFrame, step_range: tuple[int, int]) -> list[str]:
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


def _summarise(ledger: pd.DataFrame, notes: list[str], findings: list[Finding],
               procs: list[ProcessRecord]) -> tuple[dict[str, Any], dict[str, float], str]:
    count = len(ledger)
    analysed = _analysed(ledger)
    if count and not ledger["analyzed"].any():
        notes.append(f"Only {len(analysed)} steps were seen: too few to leave warm-up out, so "
                     "every step counts.")
    warm = int(ledger["warmup"].sum()) if count else 0
    if warm:
        notes.append(f"The first {warm} step(s) per rank are warm-up (lazy imports, "
                     "allocator growth, compilation) and are left out of the shares.")
    inside = int((ledger["in_window"] & ledger["in_range"]).sum()) if count else 0
    if inside:
        notes.append(f"The {inside} steps of the torch.profiler window carry doctor's own "
                     "profiling cost (the trace export most of all) and are left out of the "
                     "shares.")
    if count and "sampled" in ledger:
        left = (ledger["sampled"] & ledger["in_range"] & ~ledger["analyzed"]
                & ~ledger["warmup"] & ~ledger["in_window"])
        if left.any():
            notes.append(f"The {int(left.sum())} steps during stack sampling (py-spy pauses the "
                         "processes) are left out of the shares; the input split comes from "
                         "them.")
    steps: dict[str, Any] = {
        "count": count, "analyzed": len(analysed),
        "median_s": float(analysed["wall_s"].median()) if len(analysed) else None}
    if count and not ledger["in_range"].all():
        steps["range"] = [int(ledger.loc[ledger["in_range"], "step"].min()),
                          int(ledger.loc[ledger["in_range"], "step"].max())]
    total = float(analysed["wall_s"].sum()) if len(analysed) else 0.0
    if total <= 0:
        findings.insert(0, _no_steps_finding(procs))
        return steps, dict.fromkeys(CATEGORIES, 0.0), "unknown"
    shares = {c: float(analysed[c].sum()) / total for c in CATEGORIES}
    candidates = list(BOTTLENECKS)
    unsplit = float(analysed["input"].sum()) / total if "input" in analysed else 0.0
    if unsplit > 0:
        shares["input"] = unsplit
        candidates.append("input")
    bottleneck = max(candidates, key=lambda c: shares[c])
    if len(analysed) < FEW_STEPS:
        notes.append(f"Only {len(analysed)} steps were analysed (about {FEW_STEPS} steady "
                     "steps make a firm verdict): run the job longer for a firmer verdict.")
    return steps, shares, bottleneck


def _no_steps_finding(procs: list[ProcessRecord]) -> Finding:
    seen = "no Python process of the job recorded anything" if not procs else \
        "the job's processes recorded no optimizer step, backward() call or DataLoader batch"
    return Finding(
        id="steps.none", category="other", severity="warning",
        title="No training steps were seen, so there is nothing to split into categories",
        evidence={"processes_recorded": len(procs)},
        fixes=(Fix(
            title="Mark each step with doctor.step()",
            why=f"doctor finds steps from torch.optim, backward() and DataLoader; here {seen}.",
            code="import doctor\n\nfor batch in batches:\n    train_step(batch)\n"
                 "    doctor.step()",
        ),),
    )


def _window_status(proc: ProcessRecord) -> ProbeStatus:
    window = proc.meta.get("window")
    probes = proc.meta.get("probes", {})
    if window is None:
        base = probes.get("torch_ops")
        if base and not base.get("ok"):
            return ProbeStatus(False, base.get("reason", ""), base.get("hint", ""))
        return ProbeStatus(False, "the job ended before the profiler window opened",
                           "run 15 steps or more, or set --window START,STEPS")
    if window.get("state") == "failed":
        return ProbeStatus(False, f"torch.profiler failed: {window.get('reason')}",
                           "the verdict uses step timings only")
    if proc.trace is None:
        return ProbeStatus(False, "the job ended inside the profiler window",
                           "run more steps, or move the window with --window START,STEPS")
    return ProbeStatus(True)


def _probe_table(record: dict[str, Any], main_meta: dict[str, Any],
                 window_status: dict[int, ProbeStatus], dirs: list[Path],
                 mains: dict[int, ProcessRecord]) -> dict[str, ProbeStatus]:
    probes: dict[str, ProbeStatus] = {}
    errors = [p for d in dirs for p in bootstrap_errors(d)]
    if errors:
        probes["bootstrap"] = ProbeStatus(
            False, f"{len(errors)} process(es) could not start doctor: "
            f"{errors[0].read_text().strip()}",
            "is doctor installed in the Python that runs the job?")
    in_process = main_meta.get("probes", {})
    for name in ("steps", "dataloader", "memory"):
        status = in_process.get(name)
        if status is None:
            probes[name] = ProbeStatus(False, "torch was never imported by the job" if not mains
                                       else "no status recorded")
        else:
            probes[name] = ProbeStatus(bool(status.get("ok")), status.get("reason", ""),
                                       status.get("hint", ""))
    if mains and not main_meta.get("loaders") and probes["dataloader"].ok:
        probes["dataloader"] = ProbeStatus(True, "no DataLoader was iterated")
    if window_status:
        bad = [s for s in window_status.values() if not s.ok]
        probes["torch_ops"] = bad[0] if bad else ProbeStatus(True)
    for name, status in record.get("probes", {}).items():
        probes[name] = ProbeStatus(bool(status.get("ok")), status.get("reason", ""),
                                   status.get("hint", ""))
    return probes


def _job_meta(record: dict[str, Any], main_meta: dict[str, Any],
              mains: dict[int, ProcessRecord], procs: list[ProcessRecord],
              host: pd.DataFrame) -> dict[str, Any]:
    workers = [p for p in procs if p.role.startswith("worker")]
    return {
        "cores": int(record.get("cores") or main_meta.get("cores") or 1),
        "device": "cuda" if main_meta.get("cuda") else "cpu",
        "torch_threads": main_meta.get("torch_threads"),
        "torch_version": main_meta.get("torch_version"),
        "world_size": main_meta.get("world_size") or max(len(mains), 1),
        "ranks_here": len(mains),
        "worker_processes": len(workers),
        "main_pids": [p.pid for p in mains.values()],
        "rank_pids": {rank: p.pid for rank, p in mains.items()},  # distributed.straggler
        "worker_pids": [p.pid for p in workers],
    }


def _job_dict(record: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "argv": list(record.get("argv", [])),
        "exit_code": record.get("exit_code"),
        "ranks": meta["world_size"],
        "device": meta["device"],
        "host": record.get("host"),
        "cores": meta["cores"],
        "torch_version": meta["torch_version"],
        "python": record.get("python"),
        "started": record.get("started"),
        "duration_s": record.get("duration_s"),
    }


def _process_table(host: pd.DataFrame, procs: list[ProcessRecord]) -> pd.DataFrame:
    if host.empty:
        return pd.DataFrame()
    roles = {p.pid: f"rank {p.rank} {p.role}" for p in procs}
    g = host.groupby("pid")
    table = pd.DataFrame({
        "cpu_pct_mean": g["cpu_pct"].mean(),
        "cpu_pct_max": g["cpu_pct"].max(),
        "rss_mb_max": g["rss_bytes"].max() / 2**20,
        "read_mb": (g["read_bytes"].max() - g["read_bytes"].min()) / 2**20,
        "threads_max": g["threads"].max(),
    }).reset_index()
    table.insert(1, "process", [roles.get(int(pid), "other") for pid in table["pid"]])
    return table.replace({np.nan: None}).round(1)


def _split_evidence(splits: dict[int, StageSplit]) -> dict[str, Any]:
    """What the input split rests on, for the rules' evidence."""
    total = {s: sum(sp.seconds[s] for sp in splits.values()) for s in STAGES}
    loading = sum(total.values())
    top: dict[str, list[str]] = {}
    for stage in STAGES:
        ranked = sorted(((fn, v) for sp in splits.values() for (st, fn), v in sp.top.items()
                         if st == stage), key=lambda kv: -kv[1])
        top[stage] = [fn for fn, _ in ranked[:3]]
    return {
        "measured": loading > 0,
        "processes_sampled": sum(sp.processes for sp in splits.values()),
        "recorders": sorted({r for sp in splits.values() for r in sp.recorders}),
        "stage_shares": {s: v / loading for s, v in total.items()} if loading > 0 else {},
        "top": top,
        "collate_share_of_fetch": (sum(sp.collate_s for sp in splits.values())
                                   / max(sum(sp.fetch_s for sp in splits.values()), 1e-12)
                                   if any(sp.fetch_s for sp in splits.values()) else None),
    }


def _top_functions(splits: dict[int, StageSplit], limit: int = 12) -> pd.DataFrame:
    seconds: dict[tuple[str, str], float] = {}
    for sp in splits.values():
        for key, value in sp.top.items():
            seconds[key] = seconds.get(key, 0.0) + value
    total = sum(seconds.values())
    if total <= 0:
        return pd.DataFrame()
    rows = sorted(seconds.items(), key=lambda kv: -kv[1])[:limit]
    return pd.DataFrame({"category": [k[0] for k, _ in rows],
                         "function": [k[1] for k, _ in rows],
                         "share_of_loading": [round(v / total, 3) for _, v in rows]})


OUTSIDE_MIN = 0.02  # below this share of the step, input outside a DataLoader is noise
OUTSIDE_LABEL = " [outside DataLoader]"


def _outside_loader(mains: dict[int, ProcessRecord], splits: dict[int, StageSplit]
                    ) -> dict[int, dict[str, float]]:
    """Per rank, the share of each step spent building input outside a DataLoader."""
    out = {}
    for rank, proc in mains.items():
        samples = read_stacks(proc.path)
        if samples is None:
            continue
        shares, top = outside_loader_shares(samples)
        if sum(shares.values()) < OUTSIDE_MIN:
            continue
        out[rank] = shares
        sampled_s = samples.count / max(samples.rate_hz, 1e-9)
        for (stage, function), share in top.items():
            splits[rank].top[(stage, function + OUTSIDE_LABEL)] += share * sampled_s
    return out


def _outside_evidence(outside: dict[int, dict[str, float]], splits: dict[int, StageSplit]
                      ) -> dict[str, Any]:
    if not outside:
        return {}
    n = len(outside)
    shares = {s: sum(o.get(s, 0.0) for o in outside.values()) / n for s in STAGES}
    functions = sorted(((fn.removesuffix(OUTSIDE_LABEL), v) for sp in splits.values()
                        for (_st, fn), v in sp.top.items() if fn.endswith(OUTSIDE_LABEL)),
                       key=lambda kv: -kv[1])
    return {"stage_shares_of_step": shares, "top": [fn for fn, _ in functions[:3]]}


def _stacks_reason(record: dict[str, Any], mains: dict[int, ProcessRecord]) -> str:
    status = record.get("probes", {}).get("stacks", {})
    if status and not status.get("ok"):
        return str(status.get("reason", "the stacks probe did not run"))
    if not any(read_stacks(p.path) for p in mains.values()):
        return "no stack samples were taken: the job ended before the profiling window"
    return ""


def _crash_notes(procs: list[ProcessRecord]) -> list[str]:
    """Which ranks died of an exception, the first one first: the others usually died of it
    (a peer's connection closed), so they are marked as following it."""
    crashed = sorted((p.meta.get("crashed_ns", 0), p.rank, p.meta["crashed"]) for p in procs
                     if p.meta.get("crashed") and not p.role.startswith("worker"))
    notes = []
    for i, (_t, rank, why) in enumerate(crashed):
        after = f" (after rank {crashed[0][1]} failed)" if i and len(crashed) > 1 else ""
        notes.append(f"Rank {rank} failed{after}: {why}")
    return notes


MIN_CONTENTION = 0.02  # of the step's time outside the wait, below which it is noise


def _loading_contention(host: pd.DataFrame, system: pd.DataFrame, ledger: pd.DataFrame,
                        mains: dict[int, ProcessRecord], procs: list[ProcessRecord],
                        span: tuple[float, float] | None) -> dict[int, float]:
    """Per rank with DataLoader workers: the fraction of its steps' time outside the input wait
    that the training process spent runnable but without a core (the kernel's run-queue delay),
    times the workers' part of the CPU load competing with it."""
    if span is None or host.empty or host["run_delay_s"].isna().all():
        return {}
    machine = system[(system["t_s"] >= span[0]) & (system["t_s"] <= span[1])]
    out: dict[int, float] = {}
    for rank, main in mains.items():
        workers = [p.pid for p in workers_of(main, procs)]
        steps = ledger[(ledger["rank"] == rank) & ledger["analyzed"]]
        delayed = _per_wall(host, [main.pid], span, "run_delay_s")
        if not workers or delayed is None or steps.empty:
            continue
        rest = 1.0 - float(steps["wait_s"].sum()) / max(float(steps["wall_s"].sum()), 1e-12)
        if rest <= 0:
            continue
        of_rest = min(1.0, delayed / rest)
        loading = _cores_used(host, workers, span, total=True) or 0.0
        training = _cores_used(host, [main.pid], span) or 0.0
        busy = float(machine["busy_cores"].median()) if not machine.empty else loading + training
        competing = max(busy - training, loading, 1e-9)
        frac = of_rest * loading / competing
        if frac >= MIN_CONTENTION:
            out[rank] = frac
    return out


def _cores_used(host: pd.DataFrame, pids: list[int], span: tuple[float, float] | None,
                total: bool = False) -> float | None:
    """Cores the processes kept busy (CPU seconds over wall seconds) during the analysed steps
    (``span``, seconds from the run's start): the mean per process, or their sum."""
    return _per_wall(host, pids, span, "cpu_s", total)


def _per_wall(host: pd.DataFrame, pids: list[int], span: tuple[float, float] | None,
              counter: str, total: bool = False) -> float | None:
    """Seconds a per-process counter (``cpu_s``, ``run_delay_s``) grew per wall second over
    ``span``: the mean per process, or their sum; None without two samples of one."""
    if host.empty or not pids:
        return None
    rows = host[host["pid"].isin(pids)].dropna(subset=[counter])
    if span is not None:
        rows = rows[(rows["t_s"] >= span[0]) & (rows["t_s"] <= span[1])]
    per_pid = []
    for _pid, g in rows.groupby("pid"):
        wall = float(g["t_s"].max() - g["t_s"].min())
        if wall > 0:
            per_pid.append(float(g[counter].max() - g[counter].min()) / wall)
    if not per_pid:
        return None
    return sum(per_pid) if total else sum(per_pid) / len(per_pid)
