"""From attempts to results: speedups over the rounds, and what each try came to."""

from __future__ import annotations

import pytest

from doctor.tries.measure import AttemptResult, measure, outcome, ratio

APPLY = {"dataloader": {"num_workers": 2}}


def attempt(arm: str, round_: int, step: float, n: int = 15, **kw: object) -> AttemptResult:
    defaults: dict = {"exit_code": 0, "stopped": True,
                      "tried": {"dataloader.num_workers": {"tried": 2, "job": [0]}}}
    defaults.update(kw)
    return AttemptResult(arm=arm, round=round_, run_dir=f"/x/{round_}-{arm}",
                         step_s=[step] * n, **defaults)


def test_speedup_is_baseline_over_candidate_with_the_rounds_as_spread() -> None:
    base = [attempt("baseline", 1, 0.30), attempt("baseline", 2, 0.40)]
    cand = [attempt("c", 1, 0.10), attempt("c", 2, 0.16)]
    m = measure(base, cand)
    assert m.per_round == pytest.approx([3.0, 2.5])
    assert (m.low, m.high) == pytest.approx((2.5, 3.0))
    assert m.speedup == pytest.approx(2.75)  # the median of the rounds': within the spread
    assert m.pooled == pytest.approx(0.35 / 0.13)  # the pooled steps lean to the slow round
    assert m.steps == 30
    result, why = outcome(APPLY, cand, m)
    assert result == "faster" and "2.75x" in why
    assert ratio(m.speedup, 2.0) == pytest.approx(m.speedup / 2.0)


def test_batches_handed_over_in_pairs_are_measured_by_their_pace() -> None:
    """Two workers that finish together: a 32 ms wait, then a batch at once. The median of such
    steps lands on either kind (here 32 ms, as if the workers did nothing); the pace is 16.5 ms,
    and a GC pause's 2 s step does not move it."""
    base = [attempt("baseline", 1, 0.032, n=20)]
    paired = [0.032 if i % 2 else 0.001 for i in range(21)] + [2.0]
    cand = [AttemptResult(arm="c", round=1, run_dir="/x/1-c", exit_code=0, stopped=True,
                          step_s=paired,
                          tried={"dataloader.num_workers": {"tried": 2, "job": [0]}})]
    assert cand[0].pace_s == pytest.approx(0.0165, rel=0.05)
    m = measure(base, cand)
    assert m.speedup == pytest.approx(0.032 / 0.0165, rel=0.05)
    assert outcome(APPLY, cand, m)[0] == "faster"


def test_runs_stopped_inside_their_start_up_are_said_too_short() -> None:
    """Workers that start slowly: the first half of the steps at 60 ms, the second at 20 ms;
    a steady run says nothing."""
    from doctor.tries.measure import unsettled

    starting = AttemptResult(arm="c", round=1, run_dir="/x/1-c", exit_code=0, stopped=True,
                             step_s=[0.06] * 6 + [0.02] * 6)
    why = unsettled([starting])
    assert why is not None and "too short" in why and "3.0x" in why
    assert unsettled([attempt("c", 1, 0.02, n=12)]) is None
    assert unsettled([attempt("c", 1, 0.02, n=5)]) is None  # too few steps to say


def test_rounds_that_disagree_are_no_change() -> None:
    base = [attempt("baseline", 1, 0.30), attempt("baseline", 2, 0.30)]
    cand = [attempt("c", 1, 0.25), attempt("c", 2, 0.33)]
    assert outcome(APPLY, cand, measure(base, cand))[0] == "no change"


def test_slower_is_said() -> None:
    base = [attempt("baseline", 1, 0.10), attempt("baseline", 2, 0.11)]
    cand = [attempt("c", 1, 0.20), attempt("c", 2, 0.21)]
    assert outcome(APPLY, cand, measure(base, cand))[0] == "slower"


def test_a_job_that_fails_with_the_setting() -> None:
    base = [attempt("baseline", 1, 0.30)]
    cand = [attempt("c", 1, 0.10, exit_code=1, stopped=False)]
    m = measure(base, cand)
    assert m.speedup is None  # a failed attempt's steps are not measured
    result, why = outcome(APPLY, cand, m)
    assert result == "failed" and "status 1" in why


def test_stopped_by_doctor_is_not_a_failure_whatever_the_status() -> None:
    cand = [attempt("c", 1, 0.10, exit_code=1, stopped=True)]
    assert not cand[0].failed


def test_a_setting_the_job_already_has_or_never_meets() -> None:
    base = [attempt("baseline", 1, 0.30)]
    already = [attempt("c", 1, 0.30, tried={"dataloader.num_workers": {"tried": 2,
                                                                     "job": [2, 2]}})]
    result, why = outcome(APPLY, already, measure(base, already))
    assert result == "unchanged" and "num_workers=2" in why
    # the job asked for the value itself later (torch.set_num_threads(1) in its code)
    threads = {"torch": {"num_threads": 1}}
    asked = [attempt("c", 1, 0.3, tried={"torch.num_threads": {"tried": 1, "job": [2],
                                                               "asked": 1}})]
    assert outcome(threads, asked, measure(base, asked))[0] == "unchanged"
    never = [attempt("c", 1, 0.30, tried={})]
    assert outcome(APPLY, never, measure(base, never))[0] == "not applied"


def test_a_machine_whose_speed_changed_makes_the_try_unsure() -> None:
    from doctor.tries.measure import steadiness

    steady = [attempt("baseline", 1, 0.050), attempt("baseline", 2, 0.052)]
    assert steadiness(steady, steady) is None
    drifting = [attempt("baseline", 1, 0.050), attempt("baseline", 2, 0.100)]
    assert "50-100 ms" in (steadiness(drifting, drifting) or "")
    stolen = [attempt("baseline", 1, 0.050, steal_share=0.25)]
    assert "25%" in (steadiness(stolen, stolen) or "")


def test_a_loaders_bursts_stay_in_the_pace() -> None:
    """One step in eleven waits 100 ms for a slow batch, the others take 5 ms: a deeper queue
    that hides the waits is measured at its worth (the mean's ratio, less a lone step trimmed
    at each end), not as no change (a trim of a tenth left every burst out)."""
    bursty = [0.105 if i % 11 == 10 else 0.005 for i in range(150)]
    base = [AttemptResult(arm="baseline", round=1, run_dir="/x/1-b", exit_code=0, stopped=True,
                          step_s=bursty)]
    cand = [attempt("c", 1, 0.005, n=150)]
    m = measure(base, cand)
    assert m.speedup == pytest.approx((sum(bursty) / 150) / 0.005, rel=0.15)
    assert outcome(APPLY, cand, m)[0] == "faster"
