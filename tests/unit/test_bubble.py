"""A pipeline's bubble (doctor.analyse.bubble) on built frames: each stage's wait for its
neighbours apart from its transfers, against the schedule's theory, the stage that paces the
others, and the model's steps with more micro-batches, interleaved or balanced stages; the
fixes built from it (doctor.rules.comm_pipeline). Proportions and names only."""

from __future__ import annotations

import pandas as pd
import pytest

from doctor.analyse.bubble import Bubble, StageTime, bubble_theory, pipeline_bubble
from doctor.analyse.comms import RankComms
from doctor.analyse.parallelism import PIPELINE, Parallelism
from doctor.rules.comm_pipeline import bubble_evidence, more_microbatches_bound, pipeline_fixes


def stage(rank: int, compute: float, wait: float, transfer: float = 0.0,
          step: float = 1.0) -> StageTime:
    return StageTime(rank, str(rank), step, compute, wait, transfer)


def test_theory_is_gpipes_fill_and_drain() -> None:
    assert bubble_theory(2, 1) == pytest.approx(1 / 2)
    assert bubble_theory(2, 4) == pytest.approx(1 / 5)
    assert bubble_theory(4, 8) == pytest.approx(3 / 11)
    assert bubble_theory(1, 8) == 0.0
    b = Bubble("ScheduleInterleaved1F1B", 2, 4, 2, (stage(0, 0.5, 0.1), stage(1, 0.5, 0.1)))
    assert b.theory == pytest.approx(1 / 9)  # v stages a rank: (p-1)/(v*m+p-1)
    assert Bubble("ScheduleZBVZeroBubble", 2, 4, 2, b.stages).theory is None


def test_balanced_stages_wait_as_the_formula_and_more_microbatches_halve_it() -> None:
    # 2 balanced stages, 2 micro-batches: each computes 2/3 of the step and waits 1/3
    b = Bubble("ScheduleGPipe", 2, 2, 1, (stage(0, 2 / 3, 1 / 3), stage(1, 2 / 3, 1 / 3)))
    assert b.measured == pytest.approx(b.theory)
    assert b.imbalance == pytest.approx(1.0)
    # 4 micro-batches: (c (m+p-1)/m) = 2/3 * 5/4 of the step
    assert b.more_microbatches(2) == pytest.approx(2 / 3 * 5 / 4)
    assert b.balanced() == pytest.approx(1.0)  # nothing to balance
    # a step longer than the model says (here 0.1 of it: the model's 0.9 of compute and
    # bubble, 1/60 outside the pipeline) is each chunk's own cost: on the critical path
    # m + p - 1 times a step, so 3 times at 2 micro-batches and 5 times at 4
    t = Bubble("ScheduleGPipe", 2, 2, 1, (stage(0, 0.6, 1 / 3, 0.05),
                                          stage(1, 0.6, 1 / 3, 0.05)))
    assert t.fill_drain_s(2) == pytest.approx(0.9)
    assert t.overhead_s() == pytest.approx(1 - 1 / 60 - 0.9)
    assert t.overhead_s(4) == pytest.approx(t.overhead_s() * 5 / 3)
    assert t.more_microbatches(2) == pytest.approx(1 / 60 + 0.6 * 5 / 4 + 5 / 3 * t.overhead_s())


def test_the_stage_that_computes_most_paces_the_pipeline() -> None:
    # stage 1 computes 3x stage 0: with m micro-batches the step is (sum + (m-1) max) / m
    m = 4
    c0, c1 = 0.2, 0.6
    step = (c0 + c1 + (m - 1) * c1) / m
    b = Bubble("ScheduleGPipe", 2, m, 1, (stage(0, c0, step - c0, step=step),
                                          stage(1, c1, step - c1, step=step)))
    assert b.pacing.rank == 1
    assert b.imbalance == pytest.approx(1.5)
    # balanced at the mean (0.4): (0.8 + 3 * 0.4) / 4
    assert b.balanced() == pytest.approx((c0 + c1 + (m - 1) * 0.4) / m)
    fixes = pipeline_fixes(b)
    assert fixes[0].title.startswith("Balance the stages: rank 1's stage is the slowest")
    assert fixes[0].estimated_speedup == pytest.approx(step / b.balanced())
    text = "\n".join(f.title + f.why + f.code for f in fixes)
    assert "bucket_cap" not in text and "no_sync" not in text
    # the micro-batches alone are a setting doctor try sets; the schedule and stages are code
    assert [f.apply for f in fixes if f.apply] == [{"pipeline": {"n_microbatches": 2 * m}}]


def comms(rows: dict[int, list[tuple[float, float]]], steps: int = 1) -> dict[int, RankComms]:
    """Per rank, (seconds, exposed) sends and receives of 1 MB."""
    out = {}
    for rank, calls in rows.items():
        frame = pd.DataFrame([{"rank": rank, "kind": "sendrecv", "role": PIPELINE,
                               "bytes": 1e6, "seconds": s, "exposed_s": e}
                              for s, e in calls])
        out[rank] = RankComms(rank, frame, 0.1, steps=steps)
    return out


def test_waits_are_told_from_transfers_by_the_quickest_calls() -> None:
    # each rank: one quick call (the transfer alone: 1 ms) and ones that also waited
    c = comms({0: [(0.001, 0.001)] * 2 + [(0.021, 0.021)] * 8,
               1: [(0.001, 0.001)] * 2 + [(0.011, 0.011)] * 8})
    ledger = pd.DataFrame([{"rank": r, "wall_s": 0.5, "compute": 0.5 - x, "communication": x}
                           for r, x in ((0, 0.17), (1, 0.09)) for _ in range(3)])
    par = Parallelism(2, False, "", 0, None, 0.0, 10.0, schedule="ScheduleGPipe", stages=2,
                      microbatches=1)
    b = pipeline_bubble(ledger, c, par)
    assert b is not None and (b.ranks, b.microbatches, b.name) == (2, 1, "GPipe")
    s0, s1 = b.stages
    assert s0.transfer_s == pytest.approx(0.010)  # 10 calls of 1 ms
    assert s0.wait_s == pytest.approx(0.16)
    assert s1.wait_s == pytest.approx(0.08)
    assert b.pacing.rank == 1  # computes most
    # micro-batches from the calls where the schedule is not known: half an end stage's
    seen = pipeline_bubble(ledger, c, None)
    assert seen is not None and seen.microbatches == 5 and seen.schedule == ""
    assert pipeline_bubble(ledger, {}, par) is None


def test_stages_that_wait_for_a_core_get_no_estimate_of_more_overlap() -> None:
    # the same pipeline twice: stages with cores of their own, and stages that waited a fifth
    # of their step for one (2 ranks and other processes on 2 cores)
    own = Bubble("ScheduleGPipe", 2, 1, 1, (stage(0, 0.5, 0.5), stage(1, 0.5, 0.5)))
    crowded = Bubble("ScheduleGPipe", 2, 1, 1, (
        StageTime(0, "0", 1.0, 0.5, 0.5, 0.0, 0.2), StageTime(1, "1", 1.0, 0.5, 0.5, 0.0, 0.2)))
    assert own.core_wait == 0.0 and crowded.core_wait == pytest.approx(0.2)
    [more_own] = [f for f in pipeline_fixes(own) if "(1 -> 2)" in f.title]
    # (1 + 1/2) / 2 of 1 s: a bound, not an estimate (the compute a step may grow)
    assert more_microbatches_bound(own) == pytest.approx(1 / 0.75)
    assert more_own.estimated_speedup is None and "at most 1.33x faster" in more_own.why
    [more] = [f for f in pipeline_fixes(crowded) if "(1 -> 2)" in f.title]
    assert more.estimated_speedup is None and "waited for a core 20%" in more.why


def test_more_microbatches_are_left_out_where_their_cost_eats_the_bubble() -> None:
    # balanced stages, 2 micro-batches: compute 0.5, bubble 0.25, and 0.25 of the step the
    # model does not explain (each micro-batch's own cost): 4 would cost more than they save
    b = Bubble("ScheduleGPipe", 2, 2, 1, (stage(0, 0.5, 0.5), stage(1, 0.5, 0.5)))
    assert b.overhead_s() == pytest.approx(0.25)
    assert b.more_microbatches(2) > 1.0
    titles = [f.title for f in pipeline_fixes(b)]
    assert not any("micro-batches" in t or "Interleave" in t for t in titles)


def measured_pipeline(computes: list[float], per_chunk: float, m: int) -> Bubble:
    """The stages of a GPipe pipeline with each stage's compute a step ``computes`` and a cost
    of ``per_chunk`` a chunk and stage (sends, the schedule's Python), as a run at ``m``
    micro-batches measures them: the step is the fill-drain step of c + m d."""
    step = Bubble("ScheduleGPipe", len(computes), m, 1, ()).fill_drain_s(
        m, [c + m * per_chunk for c in computes])
    return Bubble("ScheduleGPipe", len(computes), m, 1, tuple(
        stage(r, c, step - c, step=step) for r, c in enumerate(computes)))


@pytest.mark.parametrize("p", [2, 4])
def test_each_chunks_own_cost_grows_as_its_turns_on_the_critical_path(p: int) -> None:
    # a large cost a chunk (a tenth of a stage's compute): the step at twice the micro-batches
    # is the fill-drain step of c + 2m d, neither the cost as it was nor twice it
    computes, d, m = [0.4] * p, 0.04, 2
    b = measured_pipeline(computes, d, m)
    truth = measured_pipeline(computes, d, 2 * m).step_s()
    assert b.overhead_s() == pytest.approx((m + p - 1) * d)
    assert b.more_microbatches(2) == pytest.approx(truth)
    grown_twice = b.step_s() - b.overhead_s() - b.fill_drain_s(m) + b.fill_drain_s(2 * m) + \
        2 * b.overhead_s()
    assert grown_twice > truth + 0.5 * d


def test_more_microbatches_get_a_bound_and_interleaving_an_estimate() -> None:
    # balanced stages with a bubble to win: more micro-batches are bounded (the stages'
    # compute a step as measured, which smaller micro-batches need not keep), interleaving
    # (the same rows a micro-batch) estimated
    b = measured_pipeline([0.4, 0.4], 0.01, 2)
    fixes = {f.title.split(" (")[0]: f for f in pipeline_fixes(b)}
    more = fixes["Split each batch into more micro-batches"]
    bound = b.step_s() / b.more_microbatches(2)
    assert more.estimated_speedup is None
    assert f"at most {bound:.2f}x faster" in more.why and "A bound, not an estimate" in more.why
    assert more.apply == {"pipeline": {"n_microbatches": 4}}  # doctor try times the step at 4
    assert fixes["Interleave two stages a rank"].apply is None  # the job's code
    assert bubble_evidence(b)["more_microbatches_at_most"] == pytest.approx(bound)
    inter = fixes["Interleave two stages a rank"]
    assert inter.estimated_speedup == pytest.approx(b.step_s() / b.interleaved(2))
    # sorted: the estimated fix before the bounded one
    assert pipeline_fixes(b)[0].title.startswith("Interleave")
