from __future__ import annotations

import pandas as pd
import pytest

from doctor.rules import Evidence, RuleSkipped, default_rules, rule, run_rules
from doctor.rules.compute import compute_bound
from doctor.rules.host import host_contention
from doctor.rules.input import input_handoff, input_loader, input_stage, input_unsplit
from doctor.rules.input_model import estimate_with_workers, suggested_workers
from doctor.rules.other import other_time
from tests.support import evidence, ledger, loaders


def test_input_wait_with_no_workers_suggests_workers_that_fit_the_cores() -> None:
    inputs = evidence(ledger=ledger(wait=0.09, compute=0.01), loaders=loaders(),
                      cores=16)
    [finding] = input_loader(inputs)
    assert finding.severity == "critical"
    assert finding.category == "input"  # not split: no stack samples in these inputs
    assert "num_workers=0 on a 16-core machine: set num_workers=8" in finding.fixes[0].title
    assert "num_workers=8" in finding.fixes[0].code
    # 0.1 s steps; 0.09 s of loading over 8 workers on 16 cores -> bounded by the 0.01 s rest
    assert finding.estimated_speedup == pytest.approx(0.1 / max(0.01, 0.09 / 8, 0.1 / 16))


def test_input_wait_speedup_is_bounded_by_few_cores() -> None:
    inputs = evidence(ledger=ledger(wait=0.09, compute=0.01), loaders=loaders(),
                      cores=2)
    [finding] = input_loader(inputs)
    assert finding.estimated_speedup == pytest.approx(2.0)


def test_the_workers_estimate_counts_only_the_cores_other_processes_leave() -> None:
    """On 2 cores of which other processes keep 1.3 busy, workers have 1 core, not 2: the
    gain is about 1x, not 2x, and the fix says why."""
    host = pd.DataFrame({"t_s": [float(i) for i in range(20)], "pid": [5] * 20,
                         "cpu_pct": [70.0] * 20})
    alone = evidence(ledger=ledger(wait=0.09, compute=0.01), loaders=loaders(), cores=2,
                     system=system(runnable=1, busy=0.7), host=host)
    shared = evidence(ledger=ledger(wait=0.09, compute=0.01), loaders=loaders(), cores=2,
                      system=system(runnable=3, busy=2.0), host=host)
    [free] = input_loader(alone)
    [taken] = input_loader(shared)
    assert free.estimated_speedup == pytest.approx(2.0)
    assert taken.estimated_speedup == pytest.approx(1.0)
    assert "1.3 of them busy with other processes" in taken.fixes[0].title
    assert "set num_workers=1" in taken.fixes[0].title


def test_small_input_wait_is_not_a_finding() -> None:
    inputs = evidence(ledger=ledger(wait=0.001, compute=0.1), loaders=loaders(),
                      cores=4)
    assert input_loader(inputs) == []


def test_workers_saturating_the_cores_need_cheaper_samples() -> None:
    inputs = evidence(ledger=ledger(wait=0.05, compute=0.01),
                      loaders=loaders(num_workers=2, persistent_workers=True),
                      cores=2, worker_cpu_cores=2.0)
    [finding] = input_loader(inputs)
    assert "more workers cannot help" in finding.fixes[0].title
    assert finding.estimated_speedup is None


def test_workers_with_idle_cores_get_more_workers() -> None:
    inputs = evidence(ledger=ledger(wait=0.05, compute=0.01),
                      loaders=loaders(num_workers=2),
                      cores=8, worker_cpu_cores=1.9)
    [finding] = input_loader(inputs)
    assert "set num_workers=8" in finding.fixes[0].title
    assert any("persistent_workers" in f.title for f in finding.fixes)
    # the workers spend 1.9 cores x 0.06 s = 0.114 CPU s on each batch; 8 workers on 8 cores
    assert finding.estimated_speedup == pytest.approx(0.06 / max(0.01, 0.114 / 8, 0.124 / 8))


def test_worker_estimate_model() -> None:
    assert suggested_workers(1) == 1
    assert suggested_workers(2) == 2
    assert suggested_workers(64) == 8
    assert estimate_with_workers(0.0, 1.0, 4, 4) == pytest.approx(1.0)
    # 8 workers share 0.8 s of loading, but 2 cores bound it to (0.8 + 0.2) / 2
    assert estimate_with_workers(0.8, 0.2, 2, 8) == pytest.approx(0.5)


def system(runnable: float, cores: int = 2, busy: float = 2.0, n: int = 20) -> pd.DataFrame:
    return pd.DataFrame({"t_s": [float(i) for i in range(n)], "cores": [cores] * n,
                         "runnable": [runnable + 1] * n, "busy_cores": [busy] * n,
                         "iowait_cores": [0.0] * n})


def test_host_contention_from_too_many_threads() -> None:
    inputs = evidence(system=system(runnable=8), cores=2, torch_threads=8, ranks_here=1)
    [finding] = host_contention(inputs)
    assert finding.id == "host.contention"
    assert "torch.set_num_threads(2)" in finding.fixes[0].code


def test_host_contention_from_other_load_estimates_the_gain() -> None:
    host = pd.DataFrame({"t_s": [1.0, 2.0, 3.0], "pid": [5, 5, 5], "cpu_pct": [70.0] * 3})
    inputs = evidence(system=system(runnable=5, busy=2.0), host=host, ledger=ledger(),
                      cores=2, torch_threads=2, ranks_here=1)
    [finding] = host_contention(inputs)
    assert any("Other processes" in f.title for f in finding.fixes)
    assert finding.estimated_speedup == pytest.approx(2 / 0.7)  # all compute: the cores' ratio


def test_host_contention_gain_is_bounded_by_what_the_job_could_use() -> None:
    """Freed cores speed up the compute share only (half here), and a job that keeps a
    twentieth of a core busy is not CPU-bound: no estimate (it was 50x)."""
    host = pd.DataFrame({"t_s": [1.0, 2.0, 3.0], "pid": [5, 5, 5], "cpu_pct": [70.0] * 3})
    half = evidence(system=system(runnable=5, busy=2.0), host=host,
                    ledger=ledger(wait=0.01, compute=0.01), cores=2, torch_threads=2)
    [finding] = host_contention(half)
    assert finding.estimated_speedup == pytest.approx(1 / (0.5 + 0.5 * 0.7 / 2))
    idle = evidence(system=system(runnable=5, busy=2.0), ledger=ledger(), cores=2,
                    torch_threads=2, host=host.assign(cpu_pct=4.0))
    [finding] = host_contention(idle)
    assert finding.estimated_speedup is None


def test_a_job_already_on_few_threads_is_not_told_to_use_them() -> None:
    """Contention that is not the job's: it already runs 1 thread; find the other load."""
    [finding] = host_contention(evidence(system=system(runnable=8, busy=1.8), cores=2,
                                         torch_threads=1, ranks_here=1))
    assert [f.apply for f in finding.fixes] == [None]
    assert "Find what else runs" in finding.fixes[0].title


def test_no_contention_when_runnable_fits_the_cores() -> None:
    assert host_contention(evidence(system=system(runnable=2), cores=2)) == []


def test_compute_bound_names_the_device_fixes() -> None:
    [finding] = compute_bound(evidence(ledger=ledger(compute=0.1),
                                       device="cpu", cores=4, torch_threads=2))
    assert finding.id == "compute.bound"
    assert any("torch.set_num_threads(4)" in f.code for f in finding.fixes)


def test_spiky_steps_are_named() -> None:
    findings = other_time(evidence(ledger=ledger(n=40, compute=0.1, spikes=4)))
    assert [f.id for f in findings] == ["steps.spikes"]
    [spikes] = findings
    assert spikes.evidence["spike_steps"] == 4
    # 4 s of the 8 s run are spikes above the median step; no second finding for that time
    assert spikes.estimated_speedup == pytest.approx(8.0 / (8.0 - 4 * (1.1 - 0.1)), rel=0.01)


def test_rules_are_skipped_with_a_reason_when_inputs_are_missing() -> None:
    outcome = run_rules(Evidence(), default_rules())
    assert outcome.findings == []
    assert outcome.skipped["input.loader"] == "needs ledger, loaders"
    assert outcome.skipped["host.contention"] == "needs system"


def test_a_broken_rule_is_recorded_not_raised() -> None:
    @rule("test.broken", needs=())
    def broken(inputs: Evidence) -> list:  # type: ignore[type-arg]
        raise ZeroDivisionError("boom")

    @rule("test.skips", needs=())
    def skips(inputs: Evidence) -> list:  # type: ignore[type-arg]
        raise RuleSkipped("not enough samples")

    outcome = run_rules(Evidence(), [broken, skips])
    assert outcome.skipped["test.broken"].startswith("rule failed: ZeroDivisionError")
    assert outcome.skipped["test.skips"] == "not enough samples"
    # a rule made here runs only where it is given: never in the analysis's own list
    assert not {"test.broken", "test.skips"} & {r.id for r in default_rules()}


def test_every_fix_is_valid_python() -> None:
    inputs = [
        evidence(ledger=ledger(wait=0.09), loaders=loaders(), cores=4),
        evidence(ledger=ledger(compute=0.1, other=0.1, spikes=5),
                 device="cpu", cores=4, torch_threads=1),
        evidence(system=system(runnable=9), cores=2, torch_threads=8),
        evidence(ledger=ledger(wait=0.02, compute=0.03),
                 loaders=loaders(num_workers=2, batch_tensors=4),
                 cores=2, device="cuda", fd_handoff_s=0.005),
    ]
    codes = [fix.code for i in inputs for f in run_rules(i, default_rules()).findings
             for fix in f.fixes]
    assert codes
    for code in codes:
        compile(code, "<fix>", "exec")


def test_other_time_spread_over_every_step() -> None:
    [finding] = other_time(evidence(ledger=ledger(compute=0.06, other=0.04)))
    assert finding.id == "steps.other"
    assert finding.estimated_speedup == pytest.approx(1 / 0.6)


def split_meta(**shares: float) -> dict:  # type: ignore[type-arg]
    return {"cores": 2, "split": shares,
            "top": {"io": ("read_uncached (train.py:40)",), "decode": ("ImageFile.load",),
                    "preprocess": ("collate_tokens (train.py:12)",)}}


def test_each_costly_stage_gets_its_finding_and_estimate() -> None:
    inputs = evidence(ledger=ledger(wait=0.08, compute=0.02), loaders=loaders(),
                      **split_meta(io=0.75, decode=0.05, preprocess=0.2))
    findings = {f.id: f for f in input_stage(inputs)}
    assert sorted(findings) == ["input.io", "input.preprocess"]
    io = findings["input.io"]
    assert io.category == "io"
    assert io.evidence["share_of_step"] == pytest.approx(0.6)
    # num_workers=0: removing io removes its 0.06 s from the 0.1 s step
    assert io.estimated_speedup == pytest.approx(0.1 / 0.04)
    assert any("shards" in f.title for f in io.fixes)
    assert findings["input.preprocess"].estimated_speedup == pytest.approx(0.1 / 0.084)


def test_the_loader_finding_takes_the_dominant_stage() -> None:
    inputs = evidence(ledger=ledger(wait=0.08, compute=0.02), loaders=loaders(),
                      **split_meta(io=0.1, decode=0.8, preprocess=0.1))
    [finding] = input_loader(inputs)
    assert finding.category == "decode"
    assert input_unsplit(inputs) == []


def test_unsplit_input_says_why() -> None:
    inputs = evidence(ledger=ledger(wait=0.08, compute=0.02), loaders=loaders(),
                      cores=2, unsplit_reason="the job ended before the window")
    [finding] = input_unsplit(inputs)
    assert finding.category == "input"
    assert finding.evidence["reason"] == "the job ended before the window"


def test_a_slow_collate_fn_gets_its_own_fix_only_when_it_costs() -> None:
    def fixes(collate_share: float, collate_fn: str = "pad_batch") -> list[str]:
        meta = split_meta(io=0.0, decode=0.0, preprocess=1.0)
        meta["collate_share"] = collate_share
        [finding] = input_stage(evidence(ledger=ledger(wait=0.08, compute=0.02),
                                         loaders=loaders(collate_fn=collate_fn), **meta))
        return [f.title for f in finding.fixes]

    assert fixes(0.8)[0] == "collate_fn pad_batch takes 80% of loading: vectorise it"
    assert not any("collate_fn" in t for t in fixes(0.05))
    assert not any("collate_fn" in t for t in fixes(0.8, "default_collate"))  # torch's own


def test_contention_from_workers_counts_in_the_input_share() -> None:
    frame = ledger(wait=0.02, compute=0.08)
    frame["contention_s"] = 0.04  # half the rest: waiting for cores the workers held
    inputs = evidence(ledger=frame, loaders=loaders(num_workers=2),
                      **split_meta(decode=1.0))
    [loader] = input_loader(inputs)
    assert loader.evidence["input_wait_share"] == pytest.approx(0.2)
    assert loader.evidence["input_share_with_contention"] == pytest.approx(0.6)
    assert "and for cores its workers hold 40%" in loader.title
    [stage] = input_stage(inputs)
    assert stage.id == "input.decode"
    assert stage.evidence["share_of_step"] == pytest.approx(0.6)


def test_with_workers_the_rest_keeps_what_contention_does_not_explain() -> None:
    """The training process used 0.03 s of CPU a 0.1 s step, waited 0.02 s for batches and 0.02 s
    for cores the workers held: with decoding gone, the rest is 0.06 s (its wall time less the
    contention), not its 0.03 s of CPU (the rest of that time it blocks, taking batches)."""
    frame = ledger(wait=0.02, compute=0.08)
    frame["contention_s"] = 0.02
    meta = split_meta(decode=1.0)
    meta.update(main_cpu_cores=0.3, worker_cpu_cores=1.0)
    [stage] = input_stage(evidence(ledger=frame, loaders=loaders(num_workers=2), **meta))
    assert stage.estimated_speedup == pytest.approx(0.1 / 0.06)
    meta.update(main_cpu_cores=0.7)  # CPU above the wall time less contention: CPU is the floor
    [stage] = input_stage(evidence(ledger=frame, loaders=loaders(num_workers=2), **meta))
    assert stage.estimated_speedup == pytest.approx(0.1 / 0.07)


def test_with_workers_the_estimate_keeps_the_handoff_of_each_tensor() -> None:
    """One worker takes the whole 0.1 s step to decode a batch; the training process needs 0.02 s.
    With decoding gone it still takes each of the batch's 3 tensors from the worker, 2 ms each."""
    frame = ledger(wait=0.08, compute=0.02)
    meta = split_meta(decode=1.0)
    meta.update(fd_handoff_s=0.002)

    def estimate(**settings: object) -> float | None:
        settings = {"num_workers": 1, "batch_tensors": 3, **settings}
        [stage] = input_stage(evidence(ledger=frame, loaders=loaders(**settings), **meta))
        return stage.estimated_speedup

    assert estimate() == pytest.approx(0.1 / 0.026)
    assert estimate(batch_tensors=float("nan")) == pytest.approx(0.1 / 0.02)  # not counted
    assert estimate(pin_memory=True) == pytest.approx(0.1 / 0.02)  # a thread takes them
    assert estimate(sharing_strategy="file_system") == pytest.approx(0.1 / 0.02)
    meta.update(fd_handoff_s=None)  # not measured (doctor.watch)
    assert estimate() == pytest.approx(0.1 / 0.02)


def test_moving_batches_to_workers_adds_their_handoff() -> None:
    inputs = evidence(ledger=ledger(wait=0.09, compute=0.01),
                      loaders=loaders(batch_tensors=2),
                      cores=16, fd_handoff_s=0.002)
    [finding] = input_loader(inputs)
    assert finding.evidence["batch_tensors"] == 2
    assert finding.evidence["batch_handoff_s"] == pytest.approx(0.004)
    # 8 workers: the rest of 0.01 s plus two tensors handed over, 2 ms each
    assert finding.estimated_speedup == pytest.approx(0.1 / 0.014)


def test_workers_that_keep_up_still_hand_over_each_tensor() -> None:
    """The 12 ms wait of a 50 ms step is the handoff of 6 tensors, 2 ms each (more would be
    capped at the wait): packed into one tensor, 10 ms of it goes."""
    frame = ledger(wait=0.012, compute=0.038)
    meta = {"cores": 2, "fd_handoff_s": 0.002, "device": "cpu"}

    def findings(**settings: object) -> list:  # type: ignore[type-arg]
        settings = {"num_workers": 2, "batch_tensors": 6, **settings}
        return input_handoff(evidence(ledger=frame, loaders=loaders(**settings), **meta))

    [finding] = findings()
    assert finding.evidence["share_of_step"] == pytest.approx(0.24)
    assert finding.estimated_speedup == pytest.approx(0.05 / 0.04)
    assert "instead of 6" in finding.fixes[0].title
    assert any("file_system" in f.code for f in finding.fixes)
    assert not any("pin_memory" in f.code for f in finding.fixes)  # a CPU job
    [loader] = input_loader(evidence(ledger=frame, **{**meta, "worker_cpu_cores": 0.3},
                                     loaders=loaders(num_workers=2, batch_tensors=6)))
    assert "workers keep up" in loader.fixes[0].title  # not "idle cores: more workers"
    assert "see the handoff finding" in loader.fixes[0].why
    contended = frame.assign(wait_s=0.0, contention_s=0.012)  # no wait: nothing handed over
    [loader] = input_loader(evidence(ledger=contended, **{**meta, "worker_cpu_cores": 0.3},
                                     loaders=loaders(num_workers=2, batch_tensors=6)))
    assert "workers keep up" not in loader.fixes[0].title
    assert findings(num_workers=0) == []  # batches built in the training process
    assert findings(batch_tensors=2) == []  # 4 ms: under a tenth of the step
    assert findings(pin_memory=True) == []
    meta.update(fd_handoff_s=0.01, device="cuda")
    [single] = findings(batch_tensors=1)
    assert single.estimated_speedup is None  # one tensor: nothing to pack
    assert [("file_system" in f.code, "pin_memory" in f.code) for f in single.fixes] == \
        [(True, False), (False, True)]


def test_fixes_that_need_no_code_say_the_settings_doctor_try_applies() -> None:
    [finding] = input_loader(evidence(ledger=ledger(wait=0.09, compute=0.01),
                                      loaders=loaders(), cores=16))
    fix = finding.fixes[0]
    assert fix.apply == {"dataloader": {"num_workers": 8, "persistent_workers": True}}
    assert fix.estimated_speedup == finding.estimated_speedup
    io = {f.id: f for f in input_stage(evidence(
        ledger=ledger(wait=0.08, compute=0.02), loaders=loaders(), cores=2,
        split={"io": 0.75, "decode": 0.05, "preprocess": 0.2}))}["input.io"]
    more = next(f for f in io.fixes if f.apply)
    # reads block without a core: 4 workers overlap them beyond the 2 cores' bound
    assert more.apply == {"dataloader": {"num_workers": 4, "persistent_workers": True}}
    assert more.estimated_speedup is not None and more.estimated_speedup > 2.0
    assert all(f.apply is None for f in io.fixes if f is not more)  # caching needs code


def test_every_apply_is_one_doctor_try_can_set() -> None:
    from doctor.tuning import normalize

    inputs = [
        evidence(ledger=ledger(wait=0.09), loaders=loaders(), cores=4),
        evidence(ledger=ledger(wait=0.05, compute=0.01), loaders=loaders(num_workers=2),
                 cores=8, worker_cpu_cores=1.9),
        evidence(ledger=ledger(compute=0.1), device="cpu", cores=4, torch_threads=1),
        evidence(system=system(runnable=9), cores=2, torch_threads=8),
        evidence(ledger=ledger(wait=0.02, compute=0.03),
                 loaders=loaders(num_workers=2, batch_tensors=4),
                 cores=2, device="cuda", fd_handoff_s=0.005),
    ]
    applies = [fix.apply for i in inputs for f in run_rules(i, default_rules()).findings
               for fix in f.fixes if fix.apply is not None]
    assert len(applies) >= 5
    for apply in applies:
        assert normalize(apply)
