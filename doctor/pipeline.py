"""One analysis behind every door: RunData in, Analysis out. Reads only; writes nothing.

    the analyse stages (doctor.analyse.stages: steps -> window fractions (or GPU counters)
    -> input split -> contention -> ledger -> memory -> ...) -> evidence -> rules -> verdict

It sits above both stages it runs: doctor.analyse works out the Stages record and the Evidence
built from it, doctor.rules judges the Evidence, and this module words the verdict from both.
A run directory (``analyze_run``) and traces analysed on their own (``analyze_traces``) differ
only in the RunData they load; everything after that is this one function. What a trace lacks
(stacks, host samples, the loader's settings, an exit status) is absent from its RunData, and
the stages and rules that need it are skipped; its record says it is a trace, for the few words
that say so (a fix to run doctor run instead, no exit status).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from doctor.analyse import facts
from doctor.analyse.analysis import Analysis, Sections, Tables
from doctor.analyse.bottleneck import Summary, no_steps_finding, summarise
from doctor.analyse.cause_sources import run_gc, run_slow_steps
from doctor.analyse.causes import SlowSteps, with_causes
from doctor.analyse.comms import comms_table, critical
from doctor.analyse.compiles import COMPILE
from doctor.analyse.evidence import build_evidence
from doctor.analyse.failures import failure_finding, failure_notes
from doctor.analyse.gpu_split import crosscheck_notes
from doctor.analyse.gpus import gpu_tables
from doctor.analyse.periods import period_summaries
from doctor.analyse.phase_steps import phase_summaries
from doctor.analyse.phases import PHASES
from doctor.analyse.shard_phases import shard_phases, shard_table
from doctor.analyse.stages import Stages, run_stages
from doctor.analyse.stalls import (
    MAX_FINDINGS,
    Stall,
    export_seconds,
    find_stalls,
    stall_findings,
    stall_notes,
    warmup_notes,
)
from doctor.analyse.steps import choice_notes
from doctor.analyse.tables import memory_tables, report_tables
from doctor.analyse.thread_time import sampler_note
from doctor.analyse.verified import attach_verified
from doctor.analyse.whole_run import lost_stall_findings, whole_run, whole_run_notes
from doctor.analyse.window_drift import drift_notes
from doctor.rules import RuleOutcome, default_rules, run_rules
from doctor.rules.frameworks import in_framework_words, job_framework
from doctor.rules.order import bottleneck_first
from doctor.rules.sound import job_settings, sound_findings
from doctor.store.reader import load_run
from doctor.store.rundata import TRACE, RunData
from doctor.store.traces import load_traces
from doctor.verdict import Finding, Verdict


def analyse(run: RunData, steps: tuple[int | None, int | None] | None = None) -> Analysis:
    """The verdict of ``run``; ``steps`` (first, last), 1-based, inclusive, either open, analyses
    only the steps in that range (the ledger keeps the others) and the samples of their span."""
    stages = run_stages(run, steps)
    whole = whole_run(run, stages.ledger)
    run_s = run.record.duration_s if len(run.record.nodes) <= 1 else None
    slow, gc = run_slow_steps(run, stages, run_s, whole), run_gc(run, stages, run_s)
    phases = tuple(phase_summaries(stages.table, stages.phases, stages.loaders, run_s))
    evidence = replace(build_evidence(run, stages), slow_steps=slow, gc=gc or None,
                       phases=phases or None)
    outcome = run_rules(evidence, default_rules())
    summary = summarise(stages.ledger)
    # a long step that a phase or a compilation explains is that one's finding
    # (doctor.rules.phases, doctor.rules.compiles)
    stalls = [s for s in find_stalls(stages.table, export_seconds(stages.ranks), run_s)
              if slow.cause_of(s.rank, s.step) not in (*PHASES, COMPILE)]
    findings = _findings(run, stages, outcome, summary, stalls, slow,
                         compiled=evidence.compiles is not None,
                         lost=lost_stall_findings(whole, stages.ledger, run_s))
    partial, notes = facts.exit_notes(run)
    verdict = Verdict(
        bottleneck=summary.bottleneck, shares=summary.shares, steps=summary.steps,
        findings=findings, probes=facts.probe_table(run, stages.ranks, stages.window_problems),
        job={**facts.job_dict(run, stages.job, stages.parallelism),
             **job_framework(stages.job)}, partial=partial,
        notes=notes + _notes(run, stages, outcome, summary, stalls, run_s)
        + whole_run_notes(whole, stages.ledger),
        bottleneck_share=summary.bottleneck_share, rules_skipped=outcome.skipped,
        periods=period_summaries(stages.ledger, stages.period_starts),
    )
    s = stages
    return Analysis(verdict=verdict, ledger=stages.ledger, source=run.record.source,
                    tables=_tables(run, stages),
                    sections=Sections(counters=s.counters, memory=s.memory, ops=s.ops,
                                      comms=s.comms, models=s.models,
                                      # a run recorded with the GC probe (not an older one)
                                      slow_steps=slow if slow.steps and gc else None, gc=gc,
                                      phases=phases, whole_run=whole,
                                      scaling=evidence.scaling,
                                      shard_phases=evidence.shard_phases or {}))


def _findings(run: RunData, stages: Stages, outcome: RuleOutcome, summary: Summary,
              stalls: list[Stall], slow: SlowSteps, compiled: bool,
              lost: list[Finding]) -> list[Finding]:
    """The rules' findings (no fix that doctor estimates slower, or that sets what the job has:
    doctor.rules.sound; each in the words of the job's framework too: doctor.rules.frameworks),
    then what the analysis itself finds: no steps, a long stall (a fifth
    of the run or more leads; with its cause where one is known), the job killed (first).
    ``compiled``: the job runs torch.compile (no fix offers to compile it); ``lost``: the long
    stalls among the steps the rings no longer hold (doctor.analyse.whole_run), the longest
    MAX_FINDINGS of them and the ledger's stalls kept."""
    offered = in_framework_words(
        sound_findings(outcome.findings, job_settings(stages.job, stages.loaders),
                       compiled=compiled, autocasts=stages.job.autocast),
        stages.job, stages.loaders)
    findings = attach_verified(bottleneck_first(offered, summary.bottleneck), run.record.tries)
    if summary.no_steps:
        findings.insert(0, no_steps_finding(facts.no_steps_reason(run, stages.ranks),
                                            run.record.kind == TRACE,
                                            facts.no_steps_fix(run, stages.ranks)))
    long_steps = sorted([*with_causes(stall_findings(stalls), slow), *lost],
                        key=lambda f: -float(f.evidence.get("seconds", 0.0)))[:MAX_FINDINGS]
    findings[:0] = [f for f in long_steps if f.severity == "warning"]
    findings += [f for f in long_steps if f.severity != "warning"]
    killed = failure_finding(run)
    if killed is not None:
        findings.insert(0, killed)
    return findings


def _notes(run: RunData, stages: Stages, outcome: RuleOutcome, summary: Summary,
           stalls: list[Stall], run_s: float | None) -> list[str]:
    """The notes after the exit's: how the job ran and what the figures rest on."""
    s, counters = stages, stages.counters
    return [*failure_notes(run), *stall_notes(stalls), *warmup_notes(s.table, run_s),
            *facts.source_notes(s.ranks, s.window, bool(s.windows) or bool(s.coarse)),
            *s.coarse_notes, *(counters.notes if counters else ()),
            *crosscheck_notes(counters, s.window),
            *facts.contention_notes(s.contention, s.job.cores),
            *facts.comm_contention_notes(s.comm_contention, s.job.cores),
            *(facts.range_notes(s.ledger, s.in_range) if s.in_range else []), *summary.notes,
            *facts.rule_notes(outcome.skipped),
            *facts.sampling_notes(run), *sampler_note(s.table), *facts.trace_notes(run),
            *choice_notes(run), *drift_notes(s.drifts, s.job.device)]


def _tables(run: RunData, stages: Stages) -> Tables:
    """The report's tables (each table-making function gives its own by name)."""
    s = stages
    return Tables(**report_tables(s.ledger, s.window, s.loaders, run.host, run.processes,
                                  s.splits, s.outside),
                  **gpu_tables(s.counters), **memory_tables(s.memory),
                  **({"ops": next(iter(s.ops.values())).top()} if s.ops else {}),
                  **comms_table(s.comms), **shard_table(shard_phases(s.comms)),
                  **({"comm_what_if": m.table()} if (m := critical(s.models)) is not None
                     else {}))


def analyze_run(run_dirs: Path | Sequence[Path],
                steps: tuple[int | None, int | None] | None = None) -> Analysis:
    """Analyse one run directory, or several (one per node of a multi-node job) as one job."""
    return analyse(load_run(run_dirs), steps)


def analyze_traces(paths: Sequence[str | Path]) -> Analysis:
    """Analyse torch.profiler traces, one per rank (TraceError, one line, if unreadable)."""
    return analyse(load_traces(paths))
