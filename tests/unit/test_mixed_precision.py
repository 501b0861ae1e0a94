"""Mixed precision understood (issue 35 item 2), on recorded loops: the scale over the run and its
collapse, skips only the scale shows (a fused optimizer), a calibration too long, the
micro-batches of each step, losses not finite, and the autocast the job already runs (no "use
bf16" to it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from doctor.pipeline import analyze_run
from doctor.reports.text import steps_line
from tests.support import scaled_loop


def verdict_of(tmp_path: Path) -> dict[str, Any]:
    return analyze_run(tmp_path).verdict.to_dict()


def found(verdict: dict[str, Any], rule: str) -> dict[str, Any] | None:
    return next((f for f in verdict["findings"] if f["id"] == rule), None)


def test_the_scale_collapsing_below_one_is_said_and_no_slower_growth_offered(
        tmp_path: Path) -> None:
    scaled_loop(tmp_path, 90, skip={i for i in range(90) if i % 3 == 2}, scale=2.0**8,
                growth_interval=10**6)
    f = found(verdict_of(tmp_path), "steps.skipped")
    assert f is not None
    ev = f["evidence"]
    assert ev["scale_first_log2"] == 8 and ev["scale_lowest_log2"] == -22
    assert ev["collapsed_at"] == 27  # the 9th halving from 2^8 is 2^-1, after iteration 27
    assert "fell below 1 (to 2^-22)" in f["title"]
    titles = [x["title"] for x in f["fixes"]]
    assert titles[0] == "Find what overflows" and "Let the scale grow less often" not in titles


def test_skips_that_recur_as_the_scale_grows_get_a_longer_growth_interval(
        tmp_path: Path) -> None:
    # the scale doubles every 5 clean iterations and overflows at once: one skip in 6
    skip = {i for i in range(120) if i % 6 == 5}
    scaled_loop(tmp_path, 120, skip=skip, scale=2.0**12, growth_interval=5)
    f = found(verdict_of(tmp_path), "steps.skipped")
    assert f is not None and "collapsed_at" not in f["evidence"]
    [grow] = [x for x in f["fixes"] if x["title"] == "Let the scale grow less often"]
    assert "init_scale=2.0**12" in grow["code"] and "growth_interval=4000" in grow["code"]


def test_a_fused_optimizer_skips_are_counted_from_the_scale(tmp_path: Path) -> None:
    """fused=True Adam under a scaler is stepped every iteration (its hook fires) and skips in
    its kernel: the scale halving says which iterations were skipped."""
    scaled_loop(tmp_path, 60, skip={i for i in range(60) if i % 4 == 3}, scale=2.0**16,
                fused=True)
    verdict = verdict_of(tmp_path)
    f = found(verdict, "steps.skipped")
    assert f is not None and f["evidence"]["skipped"] == 15
    assert verdict["steps"]["skipped"] == 15
    ledger = analyze_run(tmp_path).ledger
    assert int(ledger["skipped"].sum()) == 15


def test_a_long_calibration_at_the_start_gets_the_scale_it_settled_at(tmp_path: Path) -> None:
    scaled_loop(tmp_path, 80, skip=set(range(12)), scale=2.0**24)
    f = found(verdict_of(tmp_path), "steps.skipped")
    assert f is not None and f["severity"] == "info"
    assert "first 12 of 80 iterations calibrating, from a scale of 2^24 down to 2^12" in \
        f["title"]
    assert f["fixes"][0]["code"] == "scaler = torch.amp.GradScaler(init_scale=2.0**12)"
    assert f["estimated_speedup"] > 1.1


def test_a_short_calibration_is_the_scalers_design(tmp_path: Path) -> None:
    scaled_loop(tmp_path, 80, skip=set(range(4)), scale=2.0**16)
    assert found(verdict_of(tmp_path), "steps.skipped") is None


def test_the_micro_batches_of_each_step_are_a_ledger_column(tmp_path: Path) -> None:
    scaled_loop(tmp_path, 40, skip=set(), micro_batches=4)
    analysis = analyze_run(tmp_path)
    steady = analysis.ledger[analysis.ledger["analyzed"]]
    assert set(steady["micro_batches"]) == {4.0}
    verdict = analysis.verdict
    assert verdict.steps["micro_batches"] == 4
    assert "4 micro-batches (backward() calls) a step" in steps_line(verdict)


def test_one_backward_a_step_is_no_accumulation(tmp_path: Path) -> None:
    scaled_loop(tmp_path, 40, skip=set())
    verdict = analyze_run(tmp_path).verdict
    assert verdict.steps["micro_batches"] == 1 and "micro-batches" not in steps_line(verdict)


def test_inf_losses_the_scaler_skipped_say_the_forward_overflows(tmp_path: Path) -> None:
    bad = {i for i in range(60) if i % 3 == 2}
    scaled_loop(tmp_path, 60, skip=bad, nonfinite=bad, scale=2.0**16)
    verdict = verdict_of(tmp_path)
    f = found(verdict, "steps.skipped")
    assert f is not None and "the forward pass overflows" in f["title"]
    assert f["evidence"]["nonfinite_losses"] == 20
    assert found(verdict, "loss.nonfinite") is None  # the scaler kept them out of the weights


def test_inf_losses_the_optimizer_stepped_on_are_critical(tmp_path: Path) -> None:
    scaled_loop(tmp_path, 60, skip=set(), nonfinite=set(range(30, 60)), scale=2.0**16)
    f = found(verdict_of(tmp_path), "loss.nonfinite")
    assert f is not None and f["severity"] == "critical"
    assert f["evidence"]["stepped_on"] == 30 and f["evidence"]["first_step"] == 30
    assert not any(".item()" in x["code"] and "% 50" not in x["code"] for x in f["fixes"])


#: A CPU whose measured bf16 GEMM roof is 4x its fp32 one (AMX): bf16 is its fast type.
AMX = {"cpu": {"gemm_flops": {"float32": 1e11, "bfloat16": 4e11}, "copy_bytes_s": 1e10}}


def bf16_fixes(verdict: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["id"], x["title"]) for f in verdict["findings"] for x in f["fixes"]
            if "dtype=torch.bfloat16" in x["code"]]


def test_a_bf16_job_is_not_told_to_train_in_bf16(tmp_path: Path) -> None:
    """On a CPU that runs bf16 fast, an fp16 job whose scaler skips is told bf16; the same job
    already in bf16 is not."""
    skip = {i for i in range(60) if i % 3 == 2}
    scaled_loop(tmp_path / "fp16", 60, skip=skip, scale=2.0**8, autocast=("cpu", "float16"),
                peaks=AMX)
    assert ("steps.skipped", "Train in bfloat16, without the scaler") in \
        bf16_fixes(verdict_of(tmp_path / "fp16"))
    scaled_loop(tmp_path / "bf16", 60, skip=skip, scale=2.0**8, autocast=("cpu", "bfloat16"),
                peaks=AMX)
    assert bf16_fixes(verdict_of(tmp_path / "bf16")) == []
