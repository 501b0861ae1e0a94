"""One analysis behind every door: RunData in, Analysis out. Reads only; writes nothing.

    steps -> window fractions (or GPU counters) -> input split -> contention -> ledger
          -> memory -> evidence -> rules -> verdict

A run directory (``analyze_run``) and traces analysed on their own (``analyze_traces``) differ
only in the RunData they load; everything after that is this one function. What a trace lacks
(stacks, host samples, the loader's settings, an exit status) is absent from its RunData, and
the stages and rules that need it are skipped; its record says it is a trace, for the few words
that say so (a fix to run doctor run instead, no exit status).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from doctor.analyse import facts
from doctor.analyse.comms import (
    comm_models,
    comms_evidence,
    comms_table,
    critical,
    inter_node_link,
)
from doctor.analyse.contention import COMMUNICATION, INPUT, analysed_span, core_contention
from doctor.analyse.evidence import build_evidence
from doctor.analyse.failures import failure_finding, failure_notes
from doctor.analyse.gpu_split import counter_splits, crosscheck_notes
from doctor.analyse.gpus import gpu_counters, gpu_tables
from doctor.analyse.ledger import build_ledger
from doctor.analyse.memory import memory_evidence
from doctor.analyse.ops import ops_evidence
from doctor.analyse.split import outside_loader, rank_split
from doctor.analyse.stages import job_facts, training_loaders, window_analysed
from doctor.analyse.stalls import (
    export_seconds,
    find_stalls,
    stall_findings,
    stall_notes,
    warmup_notes,
)
from doctor.analyse.steps import (
    analysed,
    choice_notes,
    step_range,
    step_table,
    training_processes,
    workers_by_parent,
)
from doctor.analyse.tables import memory_tables, report_tables
from doctor.analyse.verdict import no_steps_finding, summarise
from doctor.analyse.verified import attach_verified
from doctor.analyse.window import window_frame, window_splits
from doctor.analyse.window_drift import drift_notes, fault_rates, window_drift
from doctor.rules import default_rules, run_rules
from doctor.store.reader import load_run
from doctor.store.rundata import TRACE, RunData
from doctor.store.traces import load_traces
from doctor.verdict import Analysis, Verdict


def analyse(run: RunData, steps: tuple[int | None, int | None] | None = None) -> Analysis:
    """The verdict of ``run``; ``steps`` (first, last), 1-based, inclusive, either open, analyses
    only the steps in that range (the ledger keeps the others) and the samples of their span."""
    ranks = training_processes(run)
    in_range = step_range(steps, ranks)
    table = step_table(run, ranks, in_range)
    window = window_frame(run, ranks)
    windows, window_problems = window_splits(run, ranks)
    span = analysed_span(analysed(table))
    job = job_facts(run, ranks, window)
    counters = gpu_counters(run, ranks, table) if job.device == "cuda" else None
    coarse, coarse_notes = counter_splits(counters, ranks, table, windows)
    children = workers_by_parent(run)
    workers = {rank: children.get(main.process, []) for rank, main in ranks.items()}
    splits = {rank: rank_split(run, main, workers[rank]) for rank, main in ranks.items()}
    outside = outside_loader(run, ranks)
    cores = core_contention(run.host, run.system, table, workers, ranks, span)
    contention = {r: c[INPUT] for r, c in cores.items() if INPUT in c and workers.get(r)}
    comm_contention = {r: c[COMMUNICATION] for r, c in cores.items() if COMMUNICATION in c}
    ledger = build_ledger(table, {**windows, **coarse},
                          {r: f for r, s in splits.items() if (f := s.fractions) is not None},
                          {r: o.shares for r, o in outside.items()}, contention, comm_contention)
    window, loaders = window_analysed(window, ranks, ledger), training_loaders(run, ranks)
    memory = memory_evidence(run, job.device, ranks, table, workers, counters, loaders,
                             job.world_size)
    ops = ops_evidence(run, job.device, ranks, window, counters)
    comms = comms_evidence(run, ranks, window)
    models = comm_models(run, comms, window, job, inter_node_link(run.record))
    evidence = build_evidence(run, job, ranks, workers, ledger, window, loaders, splits,
                              outside, span, in_range is not None,
                              facts.stacks_reason(run, ranks), counters, memory, ops, models)
    drifts = window_drift(ledger, fault_rates(run, ranks))  # before the window vs after
    evidence = dataclasses.replace(evidence, window_drift=drifts or None)
    outcome = run_rules(evidence, default_rules())
    summary = summarise(ledger)
    findings = attach_verified(outcome.findings, run.record.tries)
    if summary.no_steps:
        findings.insert(0, no_steps_finding(facts.no_steps_reason(run, ranks),
                                            run.record.kind == TRACE,
                                            facts.no_steps_fix(run, ranks)))
    partial, notes = facts.exit_notes(run)
    run_s = run.record.duration_s if len(run.record.nodes) <= 1 else None
    stalls = find_stalls(table, export_seconds(ranks), run_s)
    long_steps = stall_findings(stalls)  # a stall of a fifth of the run or more leads
    findings[:0] = [f for f in long_steps if f.severity == "warning"]
    findings += [f for f in long_steps if f.severity != "warning"]
    killed = failure_finding(run)
    if killed is not None:
        findings.insert(0, killed)
    notes += [*failure_notes(run), *stall_notes(stalls), *warmup_notes(table, run_s),
              *facts.source_notes(ranks, window, bool(windows) or bool(coarse)),
              *coarse_notes, *(counters.notes if counters else ()),
              *crosscheck_notes(counters, window),
              *facts.contention_notes(contention, job.cores),
              *facts.comm_contention_notes(comm_contention, job.cores),
              *(facts.range_notes(ledger, in_range) if in_range else []), *summary.notes,
              *facts.rule_notes(outcome.skipped),
              *facts.sampling_notes(run), *facts.trace_notes(run),
              *choice_notes(run), *drift_notes(drifts, job.device)]
    verdict = Verdict(
        bottleneck=summary.bottleneck, shares=summary.shares, steps=summary.steps,
        findings=findings, probes=facts.probe_table(run, ranks, window_problems),
        job=facts.job_dict(run, job), partial=partial, notes=notes,
        extra={"bottleneck_share": summary.bottleneck_share, "rules_skipped": outcome.skipped,
               **({"gpus": [g.to_dict() for g in counters.gpus]} if counters else {}),
               **({"memory": memory.to_dict()} if memory else {}),
               **({"ops": [o.to_dict() for o in ops.values()]} if ops else {}),
               **({"communication": [c.to_dict() for c in comms.values()]} if comms else {}),
               **({"comm_model": [m.to_dict() for m in models.values()]} if models else {})},
    )
    tables = {**report_tables(ledger, window, loaders, run.host, run.processes, splits, outside),
              **gpu_tables(counters), **memory_tables(memory),
              **({"ops": next(iter(ops.values())).top()} if ops else {}),
              **comms_table(comms),
              **({"comm_what_if": m.table()} if (m := critical(models)) is not None else {})}
    return Analysis(verdict=verdict, ledger=ledger, source=run.record.source, tables=tables)


def analyze_run(run_dirs: Path | Sequence[Path],
                steps: tuple[int | None, int | None] | None = None) -> Analysis:
    """Analyse one run directory, or several (one per node of a multi-node job) as one job."""
    return analyse(load_run(run_dirs), steps)


def analyze_traces(paths: Sequence[str | Path]) -> Analysis:
    """Analyse torch.profiler traces, one per rank (TraceError, one line, if unreadable)."""
    return analyse(load_traces(paths))
