"""The run door (a run directory) and the trace door (traces on their own) give one verdict.

Each case is recorded twice from the same made-up job: as a run directory written through a real
Session (fake clock), with the same job's profiler window as its trace, and as that trace alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from doctor.categories import INPUT_PIPELINE
from doctor.pipeline import analyse, analyze_run, analyze_traces
from doctor.reports.text import headline
from doctor.store.reader import load_run
from doctor.store.traces import load_traces
from tests.support import record_loop, write_record

STEP_US = 10_000.0
DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
IO_FRAME = "read_shard (/data/job.py:20)"
PREP_FRAME = "augment (/data/job.py:30)"
LOADER = ("<module> (train.py:80)", "__next__ (torch/utils/data/dataloader.py:708)",
          "_next_data (torch/utils/data/dataloader.py:764)",
          "fetch (torch/utils/data/_utils/fetch.py:52)", "__getitem__ (/data/job.py:10)")


def _ev(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    gpu = cat in ("kernel", "gpu_memcpy")
    return {"ph": "X", "cat": cat, "name": name, "pid": 0 if gpu else 1, "tid": 7 if gpu else 1,
            "ts": ts, "dur": dur, "args": args}


def gpu_trace(path: Path, steps: int = 6) -> Path:
    """Each 10 ms step: kernels 60 %, then a pageable host-to-device copy alone 25 %, then the
    GPU idle with nothing recorded 15 %."""
    events = []
    for i in range(steps):
        t = i * STEP_US
        events += [_ev("user_annotation", f"ProfilerStep#{i + 1}", t, STEP_US),
                   _ev("kernel", "volta_sgemm_128x64_nn", t, 0.60 * STEP_US),
                   _ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t + 0.60 * STEP_US,
                       0.25 * STEP_US, bytes=1 << 24)]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def cpu_trace(path: Path, wait: float, steps: int = 6) -> Path:
    """Each 10 ms step: the DataLoader ``wait`` of it, then host ops for the rest."""
    events = []
    for i in range(steps):
        t = i * STEP_US
        events += [_ev("user_annotation", f"ProfilerStep#{i + 1}", t, STEP_US),
                   _ev("user_annotation", DL, t, wait * STEP_US),
                   _ev("cpu_op", "aten::mm", t + wait * STEP_US, (1 - wait) * STEP_US)]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def run_with_window(run_dir: Path, trace: Path, *, wait_s: float = 0.0,
                    compute_s: float = 0.01) -> Path:
    """A 40-step run whose training process recorded ``trace`` as its profiler window."""
    session = record_loop(run_dir, 40, wait_s=wait_s, compute_s=compute_s)
    (session.directory / "trace.json").write_text(trace.read_text())
    write_record(run_dir, cores=2)
    return session.directory


def family(bottleneck: str) -> str:
    """A trace cannot split input by stage: its ``input`` is the run door's io/decode/preprocess."""
    return "input" if bottleneck in INPUT_PIPELINE else bottleneck


def test_transfer_25_and_compute_60_is_transfer_bound_through_either_door(tmp_path: Path) -> None:
    trace = gpu_trace(tmp_path / "window.json")
    alone = analyze_traces([trace]).verdict
    run_with_window(tmp_path / "run", trace)
    run = analyze_run(tmp_path / "run").verdict
    for verdict in (alone, run):
        assert verdict.shares["transfer"] == pytest.approx(0.25, abs=0.01)
        assert verdict.shares["compute"] == pytest.approx(0.60, abs=0.01)
        assert verdict.bottleneck == "transfer"  # stall-first: 25 % is a stall, compute is work
    assert any(f.id == "gpu.pageable_copy" for f in run.findings)
    assert any(f.id == "gpu.pageable_copy" for f in alone.findings)


def write_samples(proc_dir: Path, counts: dict[tuple[str, ...], int]) -> None:
    (proc_dir / "stacks.txt").write_text("".join(f"{';'.join(s)} {n}\n"
                                                 for s, n in counts.items()))
    (proc_dir / "stacks.json").write_text(json.dumps(
        {"recorder": "py-spy", "rate_hz": 50, "start_ns": 0, "end_ns": 1, "taken": 520}))


def test_an_input_pipeline_of_two_stages_outweighs_compute_in_both_doors(tmp_path: Path) -> None:
    """io 18 % + preprocess 34 % of the step against compute 48 %: stage by stage compute is the
    largest, but the input pipeline is one stall of 52 %, named by its largest stage."""
    trace = cpu_trace(tmp_path / "window.json", wait=0.52)
    main = run_with_window(tmp_path / "run", trace, wait_s=0.052, compute_s=0.048)
    write_samples(main, {(*LOADER, IO_FRAME): 180, (*LOADER, PREP_FRAME): 340})
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [{"category": "io", "function": "^read_shard$"}]}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCTOR_FRAME_RULES", str(rules))
        from doctor.analyse import frames

        frames.default_rules.cache_clear()
        run = analyze_run(tmp_path / "run").verdict
        frames.default_rules.cache_clear()
    assert run.shares["io"] == pytest.approx(0.18, abs=0.01)
    assert run.shares["preprocess"] == pytest.approx(0.34, abs=0.01)
    assert run.shares["compute"] == pytest.approx(0.48, abs=0.01)
    assert run.bottleneck == "preprocess"
    assert run.bottleneck_share == pytest.approx(0.52, abs=0.01)
    assert "52% of step time in the input pipeline, 34% in this stage" in headline(run)
    alone = analyze_traces([trace]).verdict
    assert alone.bottleneck == "input"
    assert alone.shares["input"] == pytest.approx(0.52, abs=0.01)
    assert family(run.bottleneck) == family(alone.bottleneck)
    for verdict in (run, alone):  # no critical finding about a larger share than the headline's
        for finding in verdict.findings:
            if finding.severity == "critical" and finding.category in INPUT_PIPELINE:
                assert family(finding.category) == family(verdict.bottleneck), finding.id


def test_a_trace_loads_into_the_same_record_as_a_run(tmp_path: Path) -> None:
    trace = gpu_trace(tmp_path / "window.json")
    run_with_window(tmp_path / "run", trace)
    from_run, from_trace = load_run(tmp_path / "run"), load_traces([trace])
    assert from_run.frames.keys() == from_trace.frames.keys()
    for name, frame in from_trace.frames.items():
        assert list(frame.columns) == list(from_run.frames[name].columns), name
    assert from_trace.host.empty and from_trace.stacks.empty  # a trace has neither
    assert len(from_trace.window) == 6
    assert analyse(from_trace).verdict.bottleneck == "transfer"


def test_a_trace_keeps_its_step_numbers_and_an_idle_one_says_what_it_saw(tmp_path: Path) -> None:
    events = [_ev("user_annotation", f"ProfilerStep#{n}", (n - 3) * STEP_US, STEP_US)
              for n in range(3, 9)]  # a schedule that began profiling at step 3
    path = tmp_path / "idle.json"
    path.write_text(json.dumps({"traceEvents": events}))
    analysis = analyze_traces([path])
    assert list(analysis.ledger["step"]) == [3, 4, 5, 6, 7, 8]
    verdict = analysis.verdict
    assert verdict.bottleneck == "unknown"  # every step is time outside any recorded op
    assert verdict.shares["other"] == pytest.approx(1.0)
    ids = [f.id for f in verdict.findings]
    assert "steps.none" not in ids  # steps were seen: the finding says where the time went
    assert "steps.other" in ids
