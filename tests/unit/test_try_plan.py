"""What doctor try runs: candidates from the findings' fixes and from --set."""

from __future__ import annotations

import pytest

from doctor.errors import UsageError
from doctor.tries.plan import COMBINED, plan_try
from doctor.verdict import Finding, Fix

WORKERS = Fix("num_workers=0: set 2", "why", apply={"dataloader": {"num_workers": 2}},
              estimated_speedup=2.5)
PERSISTENT = Fix("persistent", "why", apply={"dataloader": {"persistent_workers": True}})
CODE = Fix("vectorise the transform", "why", code="...")
THREADS = Fix("threads", "why", apply={"torch": {"num_threads": 1}})
MORE_WORKERS = Fix("more", "why", apply={"dataloader": {"num_workers": 8}},
                   estimated_speedup=1.2)


def findings() -> list[Finding]:
    return [
        Finding("input.loader", "preprocess", "critical", "waits", fixes=(WORKERS, PERSISTENT),
                estimated_speedup=2.5),
        Finding("input.preprocess", "preprocess", "critical", "transforms", fixes=(CODE,)),
        Finding("host.contention", "compute", "warning", "threads", fixes=(THREADS,)),
        Finding("input.io", "io", "warning", "reads", fixes=(MORE_WORKERS,)),
        Finding("input.stage2", "io", "info", "same fix again", fixes=(WORKERS,)),
    ]


def test_every_applicable_fix_alone_then_the_compatible_ones_together() -> None:
    plan = plan_try(findings())
    ids = [c.id for c in plan.candidates]
    assert ids == ["input.loader:1", "input.loader:2", "host.contention:1", "input.io:1",
                   COMBINED]
    first = plan.candidates[0]
    assert first.estimate == 2.5 and first.fixes == ("input.loader:1", "input.stage2:1")
    together = plan.candidates[-1]
    # num_workers=8 disagrees with num_workers=2, which came first: left out
    assert together.apply == {"dataloader": {"num_workers": 2, "persistent_workers": True},
                              "torch": {"num_threads": 1}}
    assert together.estimate is None
    assert [m.id for m in plan.manual] == ["input.preprocess:1"]


def test_fix_by_id_or_by_finding() -> None:
    assert [c.id for c in plan_try(findings(), ["input.loader:2"]).candidates] == \
        ["input.loader:2"]
    assert [c.id for c in plan_try(findings(), ["input.loader"]).candidates] == \
        ["input.loader:1", "input.loader:2"]


def test_a_fix_that_needs_code_or_does_not_exist_is_refused() -> None:
    with pytest.raises(UsageError, match="needs a change to the code"):
        plan_try(findings(), ["input.preprocess:1"])
    with pytest.raises(UsageError, match="no such fix"):
        plan_try(findings(), ["input.nothing"])


def test_a_sweep_checks_the_estimate_of_the_fix_it_equals() -> None:
    plan = plan_try(findings(), sets=["num_workers=0,2,8"])
    assert plan.sweep
    assert [c.label for c in plan.candidates] == ["num_workers=0", "num_workers=2",
                                                  "num_workers=8"]
    assert [c.estimate for c in plan.candidates] == [None, 2.5, 1.2]


def test_several_keys_go_together_and_the_product_is_bounded() -> None:
    plan = plan_try([], sets=["num_workers=2", "pin_memory=true"])
    assert [c.apply for c in plan.candidates] == \
        [{"dataloader": {"num_workers": 2, "pin_memory": True}}]
    assert not plan.sweep
    with pytest.raises(UsageError, match="combinations"):
        plan_try([], sets=["num_workers=0,1,2,3,4", "prefetch_factor=1,2,3"])
