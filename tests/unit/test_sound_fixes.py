"""The last check on the findings (doctor.rules.sound): no fix that doctor estimates slower,
none that sets only what the job already has, no finding's estimate below 1.0x."""

from __future__ import annotations

import pandas as pd

from doctor.analyse.stages import JobFacts
from doctor.rules.sound import already_set, job_settings, sound_findings
from doctor.verdict import Finding, Fix

WORKERS_2 = Fix("num_workers=2", "", apply={"dataloader": {"num_workers": 2,
                                                            "persistent_workers": True}})
ONE_THREAD = Fix("one thread", "", apply={"torch": {"num_threads": 1}})


def loaders(*workers: int, persistent: bool = True) -> pd.DataFrame:
    return pd.DataFrame({"num_workers": list(workers),
                         "persistent_workers": [persistent] * len(workers),
                         "pin_memory": [False] * len(workers),
                         "prefetch_factor": [2 if w else None for w in workers]})


def finding(*fixes: Fix, speedup: float | None = None) -> Finding:
    return Finding("x.y", "input", "warning", "t", fixes=fixes, estimated_speedup=speedup)


def test_a_fix_estimated_slower_is_not_offered() -> None:
    slower = Fix("workers=3", "", estimated_speedup=0.75)
    faster = Fix("workers=1", "", estimated_speedup=1.4)
    [f] = sound_findings([finding(slower, faster, speedup=0.75)], {})
    assert [x.title for x in f.fixes] == ["workers=1"]
    assert f.estimated_speedup is None  # a finding's estimate below 1.0x is left out


def test_a_fix_that_sets_what_the_job_has_is_not_offered() -> None:
    has_two = job_settings(JobFacts(torch_threads=1), loaders(2))
    assert already_set(WORKERS_2, has_two) and already_set(ONE_THREAD, has_two)
    [f] = sound_findings([finding(WORKERS_2, ONE_THREAD, Fix("code only", ""))], has_two)
    assert [x.title for x in f.fixes] == ["code only"]


def test_a_fix_that_changes_one_setting_of_several_stays() -> None:
    has = job_settings(JobFacts(torch_threads=4), loaders(2, persistent=False))
    assert not already_set(WORKERS_2, has)  # persistent_workers would change
    assert not already_set(ONE_THREAD, has)


def test_loaders_that_disagree_have_no_setting_of_their_own() -> None:
    """A training loader with 2 workers and an evaluation loader with none: setting 2 changes
    the second, so the fix stays."""
    has = job_settings(JobFacts(), loaders(2, 0))
    assert "num_workers" not in has.get("dataloader", {})
    assert not already_set(WORKERS_2, has)


def test_nothing_known_changes_nothing() -> None:
    f = finding(WORKERS_2, speedup=1.5)
    assert sound_findings([f], job_settings(JobFacts(), None)) == [f]
