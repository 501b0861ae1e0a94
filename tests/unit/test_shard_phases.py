"""A sharded job's collectives phase by phase (doctor.analyse.shard_phases) and FSDP's fixes
named by the phase they act on (doctor.rules.shard_fixes), on FSDP2-over-gloo traces built to
provoke each case: units gathered on demand (serialised), prefetched ahead but blocking the
thread (issued ahead, exposed), and prefetched asynchronously beside the previous unit's compute
(prefetch worked). Proportions and names only."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

from doctor.analyse.analysis import Analysis, Sections, Tables
from doctor.analyse.comms import Link, RankComms, classify, waiting_times
from doctor.analyse.parallelism import Parallelism, roles
from doctor.analyse.shard_phases import (
    AHEAD,
    BACKWARD_GATHERS,
    FORWARD_GATHERS,
    NONE,
    REDUCE_SCATTERS,
    WORKED,
    rank_phases,
    shard_phases,
    shard_table,
)
from doctor.categories import CATEGORIES
from doctor.pipeline import analyze_traces
from doctor.reports.json import verdict_data
from doctor.reports.resource_lines import shard_lines
from doctor.rules import communication, run_rules
from doctor.trace.comm_calls import collective_calls
from doctor.trace.events import build_timeline
from doctor.verdict import LEDGER_COLUMNS, Finding, Verdict
from tests.collective_frames import GLOO, calls, ev, fsdp_step, rank_comms
from tests.support import SHARED_TRACES, evidence, steps

GATHER_US, COMPUTE_US, UNITS = 400.0, 450.0, 3


def unit_gather(ts: float, unit: int, hook: str, blocking: bool
                ) -> tuple[list[dict[str, Any]], float]:
    """FSDP2 gathering ``unit`` from inside ``hook`` at ``ts``: the hook's annotation, the
    unit's, c10d's call and gloo's work (GATHER_US); the hook holds the thread until the work
    ends where ``blocking`` (a synchronous unshard), else only for the call. Returns the events
    and when the thread is free again."""
    work_end = ts + 12 + GATHER_US
    held = work_end + 5 if blocking else ts + 20
    floats = 1000
    return [
        ev("user_annotation", hook, ts, held - ts),
        ev("user_annotation", f"FSDP::all_gather ({unit})", ts + 1, held - ts - 2),
        ev("cpu_op", "c10d::_allgather_base_", ts + 5, 5,
           **{"Input Dims": [[2 * floats], [floats]], "Input type": ["float", "float"]}),
        ev("user_annotation", "gloo:all_gather", ts + 12, GATHER_US, GLOO,
           **{"Input Dims": [[floats]], "Input type": ["float"]}),
    ], held


def forward(case: str) -> list[dict[str, Any]]:
    """One forward of UNITS units, then the optimizer: ``on_demand`` (each unit gathered in
    its own pre_forward, blocking), ``ahead_blocking`` (the next unit prefetched right after
    this one's gather, still blocking), ``ahead_async`` (prefetched without blocking: its work
    runs on gloo's thread beside this unit's compute)."""
    out = [ev("user_annotation", "ProfilerStep#1", 0, 20000)]
    t = 10.0
    gathered_until = 0.0  # the prefetched unit's work end
    for u in range(UNITS):
        if case == "on_demand" or u == 0:
            events, t = unit_gather(t, u, f"FSDP::pre_forward ({u})", blocking=True)
            out += events
        elif gathered_until > t:  # waiting in pre_forward for the prefetched work
            t = gathered_until + 5
        if case != "on_demand" and u + 1 < UNITS:
            events, t_after = unit_gather(t + 2, u + 1, f"FSDP::forward_prefetch for {u + 1}",
                                     blocking=case == "ahead_blocking")
            out += events
            gathered_until = t + 2 + 12 + GATHER_US
            t = t_after + 2
        out.append(ev("cpu_op", "aten::addmm", t + 5, COMPUTE_US))
        t += COMPUTE_US + 15
    out.append(ev("user_annotation", "Optimizer.step#SGD.step", t + 10, 100))
    return out


def comms(events: list[dict[str, Any]]) -> dict[int, RankComms]:
    calls = collective_calls(build_timeline(events)).assign(rank=0, pid=1, node=0)
    calls = classify(calls, waiting_times(calls))
    calls["role"] = roles(calls)
    return {0: RankComms(0, calls, 0.02, steps=1)}


def phases_of(case: str) -> Any:
    found = rank_phases(comms(forward(case))[0].calls, 1)
    assert found is not None
    return found


def test_units_gathered_on_demand_are_serialised_and_exposed() -> None:
    p = phases_of("on_demand")
    fwd = p.of(FORWARD_GATHERS)
    assert fwd is not None and [x.phase for x in p.phases] == [FORWARD_GATHERS]
    assert fwd.calls == UNITS and fwd.prefetch == NONE and fwd.prefetched == 0.0
    assert fwd.exposed_s == pytest.approx(fwd.seconds)  # the thread waited through each
    assert fwd.overlapped_s == pytest.approx(0.0, abs=1e-6)
    # one unit ahead, each gather but the first could have run beside the unit before it
    assert fwd.hideable_s == pytest.approx((UNITS - 1) * GATHER_US * 1e-6, rel=0.05)
    assert [u.unit for u in p.units] == ["0", "1", "2"]
    assert fwd.bytes == UNITS * 8000  # the gathered output, as nccl-tests count it


def test_prefetched_gathers_that_block_the_thread_are_issued_ahead_but_exposed() -> None:
    fwd = phases_of("ahead_blocking").of(FORWARD_GATHERS)
    assert fwd is not None and fwd.prefetch == AHEAD
    assert fwd.prefetched == pytest.approx(2 / 3)  # all but the first unit's
    assert fwd.overlapped_share < 0.05
    # made asynchronous, the second unit's gather runs beside the first unit's compute; the
    # last one, issued ahead of the last unit, counts none (a floor)
    assert fwd.hideable_s == pytest.approx(GATHER_US * 1e-6, rel=0.05)


def test_prefetched_gathers_beside_the_previous_units_compute_worked() -> None:
    p = phases_of("ahead_async")
    fwd = p.of(FORWARD_GATHERS)
    assert fwd is not None and fwd.prefetch == WORKED
    # the first unit's gather has nothing before it; the other two ran beside compute
    assert fwd.overlapped_share == pytest.approx(2 / 3, abs=0.05)
    assert fwd.exposed_s == pytest.approx(GATHER_US * 1e-6, rel=0.1)
    table = p.table()
    assert table[table["unit"] == "(all)"]["prefetch"].tolist() == [WORKED]
    assert table[table["unit"] != "(all)"]["prefetch"].tolist() == ["", "ahead", "ahead"]


def test_a_step_splits_into_forward_and_backward_gathers_and_reduce_scatters() -> None:
    p = rank_phases(comms(fsdp_step())[0].calls, 1)
    assert p is not None
    assert [x.phase for x in p.phases] == [FORWARD_GATHERS, BACKWARD_GATHERS, REDUCE_SCATTERS]
    assert p.of(REDUCE_SCATTERS).prefetch == ""  # type: ignore[union-attr]
    assert p.seconds == pytest.approx(sum(x.seconds for x in p.phases))
    # the hooks around them held the thread longer than gloo worked: pre_forward, pre_backward
    # and the root's post-backward callback around the reduce-scatter's hook
    assert [x.hook_s for x in p.phases] == pytest.approx([450e-6, 440e-6, 400e-6])
    assert [x.seconds for x in p.phases] == pytest.approx([400e-6, 400e-6, 360e-6])
    data = json.loads(json.dumps(p.to_dict()))
    assert [x["phase"] for x in data["phases"]] == [FORWARD_GATHERS, BACKWARD_GATHERS,
                                                      REDUCE_SCATTERS]


def test_units_without_names_are_told_apart_by_their_order_in_each_step() -> None:
    rows = []
    for step in range(3):
        for i, nbytes in enumerate((4e6, 8e6)):
            rows.append({"kind": "allgather", "phase": "forward", "bytes": nbytes,
                         "seconds": 1e-3 * (i + 1), "exposed_s": 1e-3 * (i + 1),
                         "start_us": step * 1e4 + i * 100, "role": "sharded", "unit": "",
                         "bus_bytes_s": nbytes / 2 / 1e-3})
    p = rank_phases(pd.DataFrame(rows), 3)
    assert p is not None
    assert [(u.unit, u.bytes, u.seconds) for u in p.units] == [("#1", 4e6, 1e-3),
                                                              ("#2", 8e6, 2e-3)]


def finding(events: list[dict[str, Any]], cores: int = 8, par: Parallelism | None = None,
            gpu: bool = False) -> Finding:
    """``gpu``: the collectives' work taken as a GPU's (the same times)."""
    c = comms(events)
    if gpu:
        c = {r: replace(rc, calls=rc.calls.assign(on_gpu=True)) for r, rc in c.items()}
    window = steps(device="cpu", gpu_busy_s=0.0, comm_s=0.08, comm_exposed_s=0.08)
    [f] = run_rules(evidence(window=window, comms=c, shard_phases=shard_phases(c), cores=cores,
                             ranks_here=2, parallelism=par),
                    [communication.exposed_communication]).findings
    return f


def test_the_fix_names_the_exposed_phase_and_is_sized_by_the_compute_before_it() -> None:
    f = finding(forward("on_demand"))
    fix = next(x for x in f.fixes if x.title.startswith("Forward all-gathers exposed"))
    assert "set_modules_to_forward_prefetch" in fix.title + fix.code
    assert "_set_unshard_async_op(True)" in fix.code  # on the CPU the gather must not block
    assert "prefetch: none" in fix.why
    # two of three gathers hideable: 2/3 of the exposed communication, 80 % of the step
    assert fix.estimated_speedup == pytest.approx(1 / (1 - 0.8 * 2 / 3), rel=0.05)
    assert f.evidence["sharded_phases"]["phases"][0]["prefetch"] == NONE
    text = json.dumps([x.to_dict() for x in f.fixes])
    assert "bucket_cap" not in text and "no_sync" not in text


def test_no_core_free_leaves_the_prefetch_fix_without_an_estimate() -> None:
    f = finding(forward("on_demand"), cores=2)
    fix = next(x for x in f.fixes if x.title.startswith("Forward all-gathers exposed"))
    assert fix.estimated_speedup is None and "no core is free" in fix.why


def test_a_phase_whose_prefetch_worked_gets_no_prefetch_fix() -> None:
    f = finding(forward("ahead_async"))
    assert not any("prefetch them" in x.title for x in f.fixes)
    assert f.evidence["sharded_phases"]["phases"][0]["prefetch"] == WORKED


def test_fsdp1_already_prefetching_forward_is_not_told_to_and_fsdp2_is_not_read_so() -> None:
    def fsdp(api: str, settings: str) -> Parallelism:
        return Parallelism(2, False, api, 3, True, 0.0, 0.0, settings=settings)

    told = finding(forward("on_demand"), par=fsdp("FSDP", "forward_prefetch=False"))
    fix = next(x for x in told.fixes if x.title.startswith("Forward all-gathers exposed"))
    assert "forward_prefetch=True" in fix.code
    on = finding(forward("on_demand"), par=fsdp("FSDP", "sharding_strategy=FULL_SHARD, "
                                                        "forward_prefetch=True"))
    assert not any(x.title.startswith("Forward all-gathers exposed") for x in on.fixes)
    # FSDP2 has no such setting: its fix stays whatever the settings' words
    two = finding(forward("on_demand"), par=fsdp("FSDP2", "forward_prefetch=True"))
    assert any(x.title.startswith("Forward all-gathers exposed") for x in two.fixes)


def test_fsdp1s_fixes_are_settings_doctor_try_applies_and_fsdp2s_reshard_too() -> None:
    """FSDP1: prefetch and the strategy without a regather (its hybrid one where the job
    shards within a node) are applies of FullyShardedDataParallel's settings; FSDP2's
    prefetch names modules (code), its reshard is fully_shard's setting."""
    def fsdp(api: str, settings: str) -> Parallelism:
        return Parallelism(2, False, api, 3, True, 0.0, 0.0, settings=settings)

    def applies(par: Parallelism, gpu: bool = True) -> list[Any]:
        f = finding(fsdp_step(), par=par, gpu=gpu)
        return sorted((x.apply for x in f.fixes if "exposed" in x.title), key=json.dumps)

    # on a GPU: forward prefetch, backward prefetch (the job turned FSDP1's default off), the
    # strategy
    one = applies(fsdp("FSDP", "sharding_strategy=ShardingStrategy.FULL_SHARD, "
                               "backward_prefetch=None"))
    assert one == [{"fsdp1": {"backward_prefetch": "BACKWARD_PRE"}},
                   {"fsdp1": {"forward_prefetch": True}},
                   {"fsdp1": {"sharding_strategy": "SHARD_GRAD_OP"}}]
    hybrid = applies(fsdp("FSDP", "sharding_strategy=ShardingStrategy.HYBRID_SHARD, "
                                  "backward_prefetch=BackwardPrefetch.BACKWARD_PRE"))
    assert {"fsdp1": {"sharding_strategy": "_HYBRID_SHARD_ZERO2"}} in hybrid
    assert {"fsdp1": {"backward_prefetch": "BACKWARD_PRE"}} not in hybrid  # set already
    # on a CPU FSDP1's gathers are synchronous: its prefetch is said, neither estimated nor
    # tried; the strategy still is
    cpu = finding(fsdp_step(), par=fsdp("FSDP", "backward_prefetch=None"))
    prefetch = [x for x in cpu.fixes if "prefetch them" in x.title]
    assert prefetch and all(x.apply is None and x.estimated_speedup is None
                            and "pays on a GPU only" in x.why for x in prefetch)
    assert [x.apply for x in cpu.fixes if x.apply] == [
        {"fsdp1": {"sharding_strategy": "SHARD_GRAD_OP"}}]
    wrap = next(x for x in finding(fsdp_step(), par=fsdp("FSDP", "")).fixes
                if x.title == "Wrap fewer, larger units")
    assert "ModuleWrapPolicy" in wrap.code and "fully_shard" not in wrap.code
    two = applies(fsdp("FSDP2", ""))
    assert two == [None, None, {"fsdp": {"reshard_after_forward": False}}]


def test_gathers_in_backward_alone_are_not_fsdps_shape_and_get_none_of_its_fixes() -> None:
    # sequence parallel: activations reduce-scattered in forward, all-gathered in backward
    frame = calls([("reducescatter", "forward", 4e6, 10e-3), ("allgather", "backward", 4e6,
                                                                10e-3)])
    c = rank_comms(frame)
    window = steps(device="cpu", gpu_busy_s=0.0, comm_s=0.08, comm_exposed_s=0.08)
    [f] = run_rules(evidence(window=window, comms=c, shard_phases=shard_phases(c), cores=8,
                             ranks_here=2), [communication.exposed_communication]).findings
    assert [p["phase"] for p in f.evidence["sharded_phases"]["phases"]] == [BACKWARD_GATHERS,
                                                                           REDUCE_SCATTERS]
    text = json.dumps([x.to_dict() for x in f.fixes])
    assert "reshard_after_forward" not in text and "prefetch" not in text
    assert "fully_shard" not in text and "bucket_cap" not in text


A100_16 = SHARED_TRACES / "a100_rank0_of_16_pageable.json.gz"


@pytest.mark.skipif(not A100_16.is_file(), reason=f"{A100_16} is not beside this checkout")
def test_a_real_gpu_traces_gathers_and_scatters_by_phase_and_unit() -> None:
    # rank 0 of 16 on A100s: each step reduce-scatters two activations (96 and 16 MiB) in
    # forward and all-gathers two (2 and 12 MiB) in backward, on NCCL's stream
    analysis = analyze_traces([A100_16])
    p = analysis.sections.shard_phases[0]
    assert [(x.phase, x.calls) for x in p.phases] == [(BACKWARD_GATHERS, 2), (REDUCE_SCATTERS, 2)]
    units = {(u.phase, u.unit): u for u in p.units}
    assert units[(BACKWARD_GATHERS, "#1")].bytes == 2 * 2**20
    assert units[(BACKWARD_GATHERS, "#2")].bytes == 12 * 2**20
    assert units[(REDUCE_SCATTERS, "#1")].bytes == 96 * 2**20
    back = p.of(BACKWARD_GATHERS)
    assert back is not None and back.prefetch == NONE  # nothing beside them on the GPU
    # bus bandwidth at nccl-tests' (n-1)/n of 16 ranks: GB/s, not MB/s or TB/s
    assert all(1 < x.bus_gb_per_s < 1000 for x in p.phases)
    assert 0 < back.hideable_s <= back.exposed_s
    # not FSDP's shape (nothing gathered before forward): none of FSDP's fixes
    text = json.dumps(analysis.verdict.to_dict()["findings"])
    assert "reshard_after_forward" not in text and "set_modules_to" not in text


def test_the_reports_show_each_phase_from_the_record() -> None:
    c = comms(fsdp_step())
    link = Link("TCP loopback", 2.0, "measured")
    c = {0: replace(c[0], link=link), 1: replace(c[0], rank=1, link=link)}
    phases = shard_phases(c)
    assert set(phases) == {0, 1}
    sections = Sections(shard_phases=phases)
    (line,) = shard_lines(sections)
    assert line.startswith("Sharded collectives a step, rank 0: forward all-gathers ")
    assert "prefetch none" in line and "reduce-scatters" in line
    assert "FSDP's hooks around them 450 µs" in line
    verdict = Verdict(bottleneck="communication", shares=dict.fromkeys(CATEGORIES, 0.0),
                      steps={}, findings=[], probes={}, job={})
    data = verdict_data(Analysis(verdict, pd.DataFrame(columns=list(LEDGER_COLUMNS)), "src",
                                 Tables(), sections))
    assert [p["rank"] for p in data["sharded_phases"]] == [0, 1]
    assert data["sharded_phases"][0]["link"] == {"name": "TCP loopback", "gb_per_s": 2.0}
    assert {u["unit"] for u in data["sharded_phases"][0]["units"]} == {"0"}
    [table] = shard_table(phases).values()
    assert table["unit"].tolist() == ["(all)", "0"] * 3 * 2  # each phase, then its unit
    assert shard_lines(Sections()) == [] and shard_table({}) == {}
