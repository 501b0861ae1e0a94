"""torch.compile's own cost: compilations recorded from TorchDynamo's callbacks, the steps they
fell in left out of the shares, recompilations named with their share of the run, and no
"compile the model" to a job that compiles already."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from doctor.analyse.cause_sources import run_slow_steps
from doctor.analyse.stages import run_stages
from doctor.pipeline import analyze_run
from doctor.probes.compile import CompileProbe, key_of
from doctor.record.session import Session
from doctor.reports.json import verdict_data
from doctor.store.reader import load_run
from doctor.store.records import compile_frame, compile_key
from tests.support import FakeClock, compiled_loop


def findings(run_dir: Path) -> dict[str, dict]:
    verdict = verdict_data(analyze_run(run_dir))
    return {f["id"]: f for f in verdict["findings"]} | {"_verdict": verdict}


def test_recompilations_are_named_and_their_steps_left_out(tmp_path: Path) -> None:
    # the first compile (2 s) at step 0, then a recompile of frame 0 every 10 steps (1 s each)
    plan = {0: (2.0, compile_key(0, 0))} | {10 * k: (1.0, compile_key(0, k)) for k in range(1, 6)}
    compiled_loop(tmp_path, 80, plan)
    found = findings(tmp_path)
    verdict = found["_verdict"]
    rec = found["compile.recompiles"]
    assert rec["evidence"]["recompilations"] == 5 and rec["evidence"]["its_recompilations"] == 5
    assert rec["evidence"]["recompile_s"] == pytest.approx(5.0)
    assert rec["severity"] == "critical"  # 5 s of a 7.8 s run
    share = rec["evidence"]["recompile_share"]
    assert share == pytest.approx(5.0 / (2.0 + 5.0 + 80 * 0.01), rel=0.02)
    assert rec["estimated_speedup"] == pytest.approx(1 / (1 - share), abs=0.01)
    assert verdict["steps"]["median_s"] == pytest.approx(0.01, rel=0.05)
    assert any("torch.compile compiled are left out" in n for n in verdict["notes"])
    # the compile steps are out of the shares: the steady split is the loop's own
    assert verdict["bottleneck_share"] > 0.5
    # and they are slow for compiling, not for periodic work in the loop, nor long stalls
    run = load_run(tmp_path)
    slow = run_slow_steps(run, run_stages(run), None)
    assert [(g.cause, g.count) for g in slow.groups] == [("compile", 5)]
    assert all(s.words[0].startswith("recompilation ") for s in slow.steps)
    assert not {"steps.spikes", "steps.stall", "steps.cause.compile"} & set(found)


def test_a_frame_at_the_recompile_limit_is_said_to_run_eagerly(tmp_path: Path) -> None:
    plan = {5 * k: (0.5, compile_key(3, k)) for k in range(8)}
    compiled_loop(tmp_path, 60, plan)
    title = findings(tmp_path)["compile.recompiles"]["title"]
    assert "frame 3 reached Dynamo's recompile limit (8)" in title


def test_a_first_compile_alone_is_only_said(tmp_path: Path) -> None:
    compiled_loop(tmp_path, 60, {0: (3.0, compile_key(0, 0)), 1: (0.2, -2)})
    found = findings(tmp_path)
    assert "compile.recompiles" not in found
    first = found["compile.first"]
    assert first["severity"] == "info" and first["evidence"]["first_compile_s"] == \
        pytest.approx(3.2)
    # no "compile the model" to a model compiled already
    codes = [x["code"] for f in found.values() if isinstance(f, dict) and "fixes" in f
             for x in f["fixes"]]
    assert not any("torch.compile(model)" in c for c in codes)


def test_the_ring_key_holds_the_frame_and_which_compilation() -> None:
    assert compile_frame(compile_key(7, 3)) == (7, 3)
    dynamo = SimpleNamespace(callback_trigger=SimpleNamespace(value=1), compile_id="7/3")
    lazy = SimpleNamespace(callback_trigger=SimpleNamespace(value=2), compile_id="7/3")
    assert key_of(dynamo) == compile_key(7, 3)
    assert key_of(lazy) == -2
    assert key_of(None) == 0  # an older torch passes nothing


def test_the_probe_records_each_compilation_through_dynamos_callbacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch._dynamo.callback")
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    assert "torch._dynamo" in sys.modules
    s = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(s, "record_interval", lambda name, t0, t1, key=0: seen.append((name, key)))
    probe = CompileProbe(s)
    probe.start()
    with callback_handler.install_callbacks(CallbackTrigger.DYNAMO, "2/1"):
        pass
    assert seen == [("compile", compile_key(2, 1))]
    probe.stop()
    with callback_handler.install_callbacks(CallbackTrigger.DYNAMO, "2/2"):
        pass
    assert len(seen) == 1  # stopped: removed from Dynamo's callbacks
    s.close()
