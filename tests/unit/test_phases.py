"""Phases found without help (issue 34, item 1): evaluation passes, checkpoints and epoch starts
from recorded loops (a real Session on a FakeClock; doctor.analyse.phases, phase_steps,
doctor.rules.phases), the training verdict over training steps only, and the report's lines."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from doctor.analyse.phases import CHECKPOINT, EPOCH_START, EVALUATION, TRAIN
from doctor.pipeline import analyze_run
from doctor.record.session import STEP_DATALOADER, Session
from doctor.reports.html import render_html
from doctor.reports.json import verdict_data
from doctor.reports.text import render_text
from doctor.store.records import checkpoint_key, loader_key
from tests.support import FakeClock, write_record

WAIT_S, FORWARD_S, BACKWARD_S, OPT_S = 0.002, 0.004, 0.008, 0.002
STEP_S = WAIT_S + FORWARD_S + BACKWARD_S + OPT_S
EVAL_BATCH_S = 0.01  # an evaluation batch's wait and forward
MB = 1 << 20


@dataclass
class Plan:
    steps: int = 60
    eval_every: int = 0
    eval_batches: int = 8
    no_grad: bool = True
    ckpt_every: int = 0
    ckpt_s: float = 0.3
    ckpt_bytes: int = 200 * MB
    epoch_steps: int = 0
    workers: int = 2
    persistent: bool = False
    restart_s: float = 0.4  # the workers' shutdown and start at an epoch's start
    batches_per_step: int = 1
    in_memory: bool = False  # the evaluation batches sliced from tensors: no DataLoader


def record(run_dir: Path, plan: Plan) -> None:
    """A training loop as the probes record it: a batch, forward, backward, optimizer step; an
    evaluation pass over its own loader every ``eval_every`` steps, a checkpoint every
    ``ckpt_every``, a new iterator of the training loader every ``epoch_steps``."""
    clock = FakeClock()
    s = Session(run_dir, rank=0, clock=clock, window_start=10**9)
    train = s.record_loader({"num_workers": plan.workers, "batch_size": 32,
                             "pin_memory": False, "persistent_workers": plan.persistent,
                             "dataset": "Train"})
    val = s.record_loader({"num_workers": 0, "batch_size": 32, "pin_memory": False,
                           "persistent_workers": False, "dataset": "Val"})

    def interval(name: str, seconds: float, key: int = 0) -> None:
        t0 = clock()
        clock.tick(seconds)
        s.record_interval(name, t0, clock(), key)

    interval("loader_iter", 0.05, train)
    for step in range(1, plan.steps + 1):
        for _ in range(plan.batches_per_step):
            interval("loader_wait", WAIT_S, loader_key(train))
            s.count_step(STEP_DATALOADER)
        clock.tick(FORWARD_S)
        interval("backward", BACKWARD_S)
        s.record_optimizer_start()
        clock.tick(OPT_S)
        s.record_optimizer_end(0)
        if plan.eval_every and step % plan.eval_every == 0 and plan.in_memory:
            interval("eval_mode", plan.eval_batches * EVAL_BATCH_S)  # model.eval() .. train()
        elif plan.eval_every and step % plan.eval_every == 0:
            interval("loader_iter", 0.0005, val)
            for _ in range(plan.eval_batches):
                interval("loader_wait", EVAL_BATCH_S / 2, loader_key(val, not plan.no_grad))
                clock.tick(EVAL_BATCH_S / 2)
            interval("loader_end", 0.0001, val)
        if plan.ckpt_every and step % plan.ckpt_every == 0:
            interval("checkpoint", plan.ckpt_s, checkpoint_key(0, plan.ckpt_bytes))
        if plan.epoch_steps and step % plan.epoch_steps == 0 and step < plan.steps:
            interval("loader_end", plan.restart_s / 2, train)
            interval("loader_iter", plan.restart_s / 2, train)
    s.close()
    write_record(run_dir, t0_monotonic_s=0.0)


def phases_of(run_dir: Path) -> dict[str, dict]:
    return {p["phase"]: p for p in verdict_data(analyze_run(run_dir)).get("phases", [])}


def test_evaluation_every_n_steps_is_a_phase_and_the_training_verdict_is_unchanged(
        tmp_path: Path) -> None:
    record(tmp_path / "plain", Plan())
    record(tmp_path / "eval", Plan(eval_every=10))
    plain, evals = analyze_run(tmp_path / "plain"), analyze_run(tmp_path / "eval")
    # the shares, the median step and the bottleneck are those of the training steps alone
    assert evals.verdict.bottleneck == plain.verdict.bottleneck
    for category, share in plain.verdict.shares.items():
        assert evals.verdict.shares[category] == pytest.approx(share, abs=0.01)
    assert evals.verdict.steps["median_s"] == pytest.approx(plain.verdict.steps["median_s"])
    ledger = evals.ledger
    # a step runs from one optimizer step to the next: the loop's 11th holds the pass after
    # its 10th, and is the 10th step timed
    assert set(ledger.loc[ledger["phase"] == EVALUATION, "step"]) == {10, 20, 30, 40, 50}
    assert not ledger.loc[ledger["phase"] == EVALUATION, "analyzed"].any()
    assert set(ledger.loc[ledger["phase"] != EVALUATION, "phase"]) == {TRAIN}
    p = phases_of(tmp_path / "eval")[EVALUATION]
    assert p["count"] == 6 and p["batches_per_pass"] == 8  # the last, after the last step, too
    assert p["per_occurrence_s"] == pytest.approx(8 * EVAL_BATCH_S + 0.0006, rel=0.01)
    finding = next(f for f in evals.verdict.findings if f.id == "phases.evaluation")
    whole = p["seconds"] / p["share_of_run"]
    assert finding.estimated_speedup == pytest.approx(whole / (whole - p["seconds"] / 2),
                                                      rel=0.01)
    assert "Evaluate less often" in finding.fixes[0].title
    # no slow-step finding of its own, and no "make periodic work rarer" for it
    ids = {f.id for f in evals.verdict.findings}
    assert "steps.spikes" not in ids and not any(i.startswith("steps.cause") for i in ids)


def test_a_pass_with_autograd_on_is_found_by_its_batches_alone(tmp_path: Path) -> None:
    record(tmp_path, Plan(eval_every=15, no_grad=False))
    assert phases_of(tmp_path)[EVALUATION]["count"] == 4


def test_an_evaluation_with_no_dataloader_is_found_by_the_models_mode(tmp_path: Path) -> None:
    """Batches sliced from tensors under model.eval(): no loader waits, but the stretch from
    model.eval() to model.train() with no backward in it is the pass; the training verdict
    stays that of the plain loop."""
    record(tmp_path / "plain", Plan())
    record(tmp_path / "eval", Plan(eval_every=10, in_memory=True))
    plain, evals = analyze_run(tmp_path / "plain"), analyze_run(tmp_path / "eval")
    p = phases_of(tmp_path / "eval")[EVALUATION]
    assert p["count"] == 6 and p.get("batches_per_pass") is None
    assert p["per_occurrence_s"] == pytest.approx(8 * EVAL_BATCH_S, rel=0.01)
    assert evals.verdict.steps["median_s"] == pytest.approx(plain.verdict.steps["median_s"])
    assert "phases.evaluation" in {f.id for f in evals.verdict.findings}


def test_two_batches_a_step_for_one_backward_are_no_evaluation(tmp_path: Path) -> None:
    record(tmp_path, Plan(batches_per_step=2))
    assert EVALUATION not in phases_of(tmp_path)
    # ...and with such steps, an evaluation pass is still one
    record(tmp_path / "eval", Plan(batches_per_step=2, eval_every=20, no_grad=False))
    assert phases_of(tmp_path / "eval")[EVALUATION]["count"] == 3


def test_checkpoints_get_their_time_bytes_and_write_speed_and_the_async_fix(
        tmp_path: Path) -> None:
    record(tmp_path, Plan(ckpt_every=20))
    analysis = analyze_run(tmp_path)
    p = {q.kind: q for q in analysis.sections.phases}[CHECKPOINT]
    assert p.count == 3 and p.per_s == pytest.approx(0.3)
    assert p.bytes == pytest.approx(3 * 200 * MB, rel=0.001)
    assert p.bytes_s == pytest.approx(200 * MB / 0.3, rel=0.001)
    assert p.steps == (20, 40)  # the third, after the last step, in none
    finding = next(f for f in analysis.verdict.findings if f.id == "phases.checkpoint")
    assert "async_save" in finding.fixes[0].code
    whole = p.seconds / p.share
    assert finding.estimated_speedup == pytest.approx(whole / (whole - p.seconds), rel=0.01)
    assert "200 MiB each" in finding.title


def test_epoch_starts_with_workers_restarted_get_persistent_workers(tmp_path: Path) -> None:
    record(tmp_path, Plan(epoch_steps=15, steps=60))
    analysis = analyze_run(tmp_path)
    p = {q.kind: q for q in analysis.sections.phases}[EPOCH_START]
    assert p.count == 3 and p.per_s == pytest.approx(0.4, rel=0.01)
    assert p.num_workers == 2 and p.persistent_workers is False
    assert p.steps == (15, 30, 45)
    finding = next(f for f in analysis.verdict.findings if f.id == "phases.epoch_start")
    assert finding.fixes[0].apply == {"dataloader": {"persistent_workers": True}}
    assert finding.estimated_speedup > 1.0


def test_persistent_workers_get_no_epoch_finding(tmp_path: Path) -> None:
    record(tmp_path, Plan(epoch_steps=15, persistent=True, restart_s=0.002))
    analysis = analyze_run(tmp_path)
    assert EPOCH_START in {q.kind for q in analysis.sections.phases}
    assert "phases.epoch_start" not in {f.id for f in analysis.verdict.findings}


def test_a_save_every_step_is_part_of_the_steps(tmp_path: Path) -> None:
    record(tmp_path, Plan(ckpt_every=1, ckpt_s=0.01))
    analysis = analyze_run(tmp_path)
    assert set(analysis.ledger["phase"]) == {TRAIN}
    assert {q.kind for q in analysis.sections.phases} >= {CHECKPOINT}


def test_the_reports_say_each_phase(tmp_path: Path) -> None:
    record(tmp_path, Plan(eval_every=10, ckpt_every=20, epoch_steps=30))
    analysis = analyze_run(tmp_path)
    text = render_text(analysis)
    assert "evaluation, rank 0: 6 passes of 8 batches" in text
    assert "checkpoints, rank 0: 3 saves of 200 MiB" in text
    assert "epoch starts, rank 0: 1 start (2 workers, persistent_workers=False)" in text
    html = render_html(analysis)
    assert 'id="phases"' in html and "6 passes of 8 batches" in html


def test_a_long_phase_step_is_its_phases_finding_not_a_stall(tmp_path: Path) -> None:
    record(tmp_path, Plan(eval_every=20, eval_batches=200, ckpt_every=30, ckpt_s=1.5))
    analysis = analyze_run(tmp_path)
    ids = [f.id for f in analysis.verdict.findings]
    assert "steps.stall" not in ids
    assert ids[:2] == ["phases.evaluation", "phases.checkpoint"]
    assert not any("Step 20 took" in n for n in analysis.verdict.notes)
