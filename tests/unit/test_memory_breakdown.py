"""The memory breakdown (doctor.analyse.memory) and its rules: growth told from jumps, copied
pages told from allocated ones, the fixes' bytes from the measured parts, a GPU run's allocator
snapshots (fake torch.cuda with the real statistics' names), and a real trace's memory events."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from doctor.analyse.memory import MemoryEvidence, RankMemory
from doctor.analyse.memory_growth import MIN_WORKER_GROWTH_BYTES, linear_growth, worker_growth
from doctor.pipeline import analyze_run, analyze_traces
from doctor.probes.memory import MemoryProbe
from doctor.record.session import Session
from doctor.reports.json import verdict_data
from doctor.rules import Evidence
from doctor.rules.memory_fit import headroom, memory_fixes, near_limit
from doctor.rules.memory_growth import creep
from tests.fake_nvml import FakeGpu, FakeNvml, const, mark_cuda, sample_run
from tests.support import SHARED_TRACES, FakeClock, fake_torch, write_record

MIB = float(1 << 20)
GIB = float(1 << 30)


def steps_and_seconds(n: int) -> tuple[np.ndarray, np.ndarray]:
    steps = np.arange(20, 20 + 4 * n, 4, dtype=float)
    return steps, steps * 0.05


def test_steady_growth_is_found_with_its_rate() -> None:
    steps, t = steps_and_seconds(12)
    rng = np.random.default_rng(0)
    values = 1 * GIB + 3 * MIB * steps + rng.normal(0, 2 * MIB, steps.size)
    g = linear_growth(steps, values, t, "RSS")
    assert g is not None
    assert g.bytes_per_step == pytest.approx(3 * MIB, rel=0.05)
    assert g.steps_to(300 * MIB) == pytest.approx(100, rel=0.06)


@pytest.mark.parametrize("shape", ["jump", "saturating", "flat", "noise"])
def test_what_is_not_steady_growth_is_not_said(shape: str) -> None:
    steps, t = steps_and_seconds(12)
    rng = np.random.default_rng(1)
    base = 1 * GIB
    values = {
        "jump": base + np.where(steps > steps[5], 400 * MIB, 0.0),  # a cache filled once
        "saturating": base + 500 * MIB * (1 - np.exp(-(steps - steps[0]) / 6)),
        "flat": np.full(steps.size, base),
        "noise": base + rng.normal(0, 50 * MIB, steps.size),
    }[shape]
    assert linear_growth(steps, values, t, "RSS") is None


def test_copied_pages_are_told_from_allocated_ones() -> None:
    t = np.array([0.0, 2.0, 4.0, 6.0])
    copied = (t, np.array([4, 80, 120, 126]) * MIB, np.full(4, 350 * MIB))  # RSS flat
    allocated = (t, np.array([4, 80, 120, 126]) * MIB, np.array([350, 430, 470, 476]) * MIB)
    found = worker_growth(0, [copied, copied])
    assert found is not None and found.growing == 2
    assert found.median_growth_bytes == pytest.approx(122 * MIB)
    assert worker_growth(0, [allocated, allocated]) is None
    small = (t, np.array([4, 10, 20, 30]) * MIB, np.full(4, 350 * MIB))
    assert 26 * MIB < MIN_WORKER_GROWTH_BYTES
    assert worker_growth(0, [small, small]) is None


def record_short_lived_workers(run_dir: Path, copied: float, allocated: float) -> None:
    """A training process and two DataLoader workers that each lived for less than the host
    probe's interval (no reading of theirs in host.ring): only what each worker recorded of
    itself as it started and as it ended, ``copied`` bytes turned own and ``allocated`` added."""
    clock = FakeClock()
    main = Session(run_dir, rank=0, clock=clock)
    for _ in range(20):
        clock.tick(0.05)
        main.record_optimizer_start()
        clock.tick(0.01)
        main.record_optimizer_end(0)
    for k in range(2):
        worker = Session(run_dir, rank=0, clock=clock, role=f"worker{k}")
        worker.pid = main.pid + 1 + k
        start = {"t_ns": clock(), "private_bytes": 3 * MIB, "rss_bytes": 330 * MIB}
        clock.tick(0.4)
        end = {"t_ns": clock(), "private_bytes": 3 * MIB + copied + allocated,
               "rss_bytes": 330 * MIB + allocated}
        worker.update_meta(ppid=main.pid, memory_at_start=start, memory_at_end=end)
        worker.close()
    main.close()
    write_record(run_dir)


def test_workers_read_only_at_their_start_and_end_are_measured(tmp_path: Path) -> None:
    record_short_lived_workers(tmp_path / "copied", copied=100 * MIB, allocated=0.0)
    [f] = [f for f in analyze_run(tmp_path / "copied").verdict.findings
           if f.id == "memory.worker_growth"]
    assert f.evidence["workers"] == 2 and f.evidence["growing"] == 2
    assert f.evidence["median_growth_bytes"] == pytest.approx(100 * MIB)
    record_short_lived_workers(tmp_path / "allocated", copied=0.0, allocated=100 * MIB)
    assert "memory.worker_growth" not in [
        f.id for f in analyze_run(tmp_path / "allocated").verdict.findings]


def gpu_rank(**overrides: Any) -> RankMemory:
    fields: dict[str, Any] = dict(
        rank=0, node=0, device="cuda",
        parts={"parameters": 2 * GIB, "gradients": 2 * GIB, "optimizer_state": 4 * GIB,
               "activations": 60 * GIB},
        by_dtype={"parameters": {"cuda:float32": 2 * GIB},
                  "optimizer_state": {"cuda:float32": 4 * GIB},
                  "activations": {"cuda:float32": 50 * GIB, "cuda:bfloat16": 10 * GIB}},
        optimizers=("AdamW",), allocator={"reserved_peak_bytes": 76 * GIB,
                                          "allocated_peak_bytes": 70 * GIB,
                                          "inactive_split_max_bytes": 1 * GIB},
        peak_bytes=76 * GIB, capacity_bytes=80 * GIB, batch_size=32)
    fields.update(overrides)
    return RankMemory(**fields)


def test_near_the_limit_each_fix_says_what_it_frees() -> None:
    [f] = near_limit(Evidence(memory_use=MemoryEvidence({0: gpu_rank()}, world_size=4)))
    assert f.id == "memory.near_limit" and f.severity == "critical"  # 95 % full
    assert f.evidence["largest_part"] == "activations"
    frees = {fix.title.split(" (")[0].split(",")[0]: fix.frees_bytes for fix in f.fixes}
    assert frees["Autocast the forward pass to bfloat16"] == 25 * GIB  # half the fp32 ones
    assert frees["Activation checkpointing in 4 segments"] == 45 * GIB
    assert frees["batch_size 32 -> 16"] == 30 * GIB
    assert frees["Shard the optimizer state over the 4 ranks"] == 3 * GIB
    assert frees["FSDP over the 4 ranks"] == 6 * GIB
    assert frees["An 8-bit AdamW"] == 3 * GIB
    assert [x.frees_bytes for x in f.fixes] == sorted((x.frees_bytes for x in f.fixes),
                                                      reverse=True)
    # split blocks are 1.3 % of reserved: fragmentation is not the cause, no such fix
    assert not any("xpandable" in x.title for x in f.fixes)
    fragmented = gpu_rank(allocator={"reserved_peak_bytes": 76 * GIB,
                                     "inactive_split_max_bytes": 12 * GIB})
    assert any(x.frees_bytes == 12 * GIB and "xpandable" in x.title
               for x in memory_fixes(fragmented, 1))


def test_one_rank_has_no_sharding_fix_and_roomy_memory_no_finding() -> None:
    fixes = memory_fixes(gpu_rank(), 1)
    assert not any("Shard" in f.title or "FSDP" in f.title for f in fixes)
    roomy = gpu_rank(peak_bytes=40 * GIB)
    assert near_limit(Evidence(memory_use=MemoryEvidence({0: roomy}))) == []
    oom = gpu_rank(peak_bytes=40 * GIB, allocator={"num_ooms": 2.0})
    [f] = near_limit(Evidence(memory_use=MemoryEvidence({0: oom})))
    assert f.severity == "critical" and f.evidence["num_ooms"] == 2


def test_a_cpu_machine_counts_its_ranks_together() -> None:
    cpu = gpu_rank(device="cpu", peak_bytes=6 * GIB, machine_peak_bytes=23 * GIB,
                   capacity_bytes=24 * GIB, allocator={}, by_dtype={})
    [f] = near_limit(Evidence(memory_use=MemoryEvidence({0: cpu})))
    assert "the machine" in f.title and f.evidence["used_share"] == pytest.approx(23 / 24)


def test_room_for_a_larger_batch_on_an_under_used_gpu() -> None:
    m = gpu_rank(parts={"parameters": 1 * GIB, "gradients": 1 * GIB, "optimizer_state": 2 * GIB,
                        "activations": 6 * GIB}, peak_bytes=12 * GIB, batch_size=32)
    busy = SimpleNamespace(of_rank=lambda rank: SimpleNamespace(util=0.95))
    idle = SimpleNamespace(of_rank=lambda rank: SimpleNamespace(util=0.40))
    mem = MemoryEvidence({0: m})
    assert headroom(Evidence(memory_use=mem, gpus=busy)) == []  # type: ignore[arg-type]
    [f] = headroom(Evidence(memory_use=mem, gpus=idle))  # type: ignore[arg-type]
    # 90 % of 80 GiB, less the 6 GiB that do not scale with the batch, over 6 GiB per 32
    assert f.evidence["fitting_batch_size"] == int(32 * (72 - 6) / 6)


def test_no_larger_batch_for_a_gpu_that_waits_for_input() -> None:
    """The GPU idles because input is late (gpu.starved): a larger batch makes each wait
    longer, not the GPU busier, so headroom says nothing."""
    import pandas as pd

    m = gpu_rank(parts={"parameters": 1 * GIB, "gradients": 1 * GIB, "optimizer_state": 2 * GIB,
                        "activations": 6 * GIB}, peak_bytes=12 * GIB, batch_size=32)
    idle = SimpleNamespace(of_rank=lambda rank: SimpleNamespace(util=0.40))
    mem = MemoryEvidence({0: m})

    def ledger(input_s: float) -> pd.DataFrame:
        return pd.DataFrame({"rank": [0] * 4, "wall_s": [0.1] * 4, "io": [input_s] * 4,
                             "decode": [0.0] * 4, "preprocess": [0.0] * 4,
                             "compute": [0.1 - input_s] * 4})

    starved = Evidence(memory_use=mem, gpus=idle, ledger=ledger(0.06))  # type: ignore[arg-type]
    fed = Evidence(memory_use=mem, gpus=idle, ledger=ledger(0.0))  # type: ignore[arg-type]
    assert headroom(starved) == []
    assert [f.id for f in headroom(fed)] == ["memory.headroom"]


def record_gpu_run(run_dir: Path, steps: int, leak_per_step: float) -> None:
    """A GPU job's allocator as the memory probe sees it (fake torch.cuda, the real statistics'
    names): 10 ms steps, allocated bytes between steps growing by ``leak_per_step``."""
    clock = FakeClock()
    session = Session(run_dir, rank=0, clock=clock, window_start=10**9)
    torch = fake_torch()
    probe = MemoryProbe(session, torch)
    probe.start()
    stats = torch.cuda.stats
    for step in range(steps):
        stats["allocated_bytes.all.current"] = 10 * GIB + leak_per_step * step
        stats["allocated_bytes.all.peak"] = 18 * GIB + leak_per_step * step
        stats["reserved_bytes.all.current"] = stats["reserved_bytes.all.peak"] = \
            20 * GIB + leak_per_step * step
        stats["inactive_split_bytes.all.current"] = 0
        stats["num_alloc_retries"] = 0
        clock.tick(0.1)
        session.record_optimizer_start()
        clock.tick(0.01)
        session.record_optimizer_end(0)
    session.close()
    write_record(run_dir)
    mark_cuda(run_dir)


def test_a_gpu_job_whose_allocated_memory_creeps(tmp_path: Path) -> None:
    record_gpu_run(tmp_path, 400, 64 * MIB)
    analysis = analyze_run(tmp_path)
    verdict = analysis.verdict
    [m] = verdict_data(analysis)["memory"]["ranks"]
    assert m["device"] == "cuda"
    assert m["allocator"]["allocated_peak_bytes"] >= 18 * GIB
    assert m["capacity_bytes"] == 80 * GIB  # the device's own memory, from the allocator
    [f] = [f for f in verdict.findings if f.id == "memory.creep"]
    assert f.evidence["source"] == "CUDA allocated"
    assert f.evidence["bytes_per_step"] == pytest.approx(64 * MIB, rel=0.02)
    # reserved ends near 20 GiB + 400 x 64 MiB = 45 GiB: 35 GiB left at 64 MiB a step
    left = 80 * GIB - (20 * GIB + 399 * 64 * MIB)
    assert f.evidence["limit_step"] == pytest.approx(f.evidence["last_step"] + left / (64 * MIB),
                                                     abs=3)
    # the fixes sync with the GPU only when logging, never every step (gpu.host_sync)
    for fix in f.fixes:
        per_step = [line for line in fix.code.splitlines()
                    if not line.startswith((" ", "if ")) and not line.startswith("#")]
        assert not any(".item()" in line.split("#")[0] or ".cpu()" in line.split("#")[0]
                       for line in per_step), fix.code


def test_a_gpu_job_with_flat_memory_does_not_creep(tmp_path: Path) -> None:
    record_gpu_run(tmp_path, 400, 0.0)
    analysis = analyze_run(tmp_path)
    assert "memory.creep" not in [f.id for f in analysis.verdict.findings]
    [m] = verdict_data(analysis)["memory"]["ranks"]
    assert m["growth"] is None and m["headroom_bytes"] == pytest.approx(60 * GIB)


def test_nvml_used_memory_is_the_peak_when_it_is_more_than_reserved(tmp_path: Path) -> None:
    record_gpu_run(tmp_path, 100, 0.0)
    sample_run(tmp_path, FakeNvml([FakeGpu(util=const(30.0), mem_used=const(21 * GIB))]),
               seconds=12)
    analysis = analyze_run(tmp_path)
    [m] = verdict_data(analysis)["memory"]["ranks"]
    assert m["peak_bytes"] == pytest.approx(21 * GIB)  # NVML saw more than reserved
    assert "NVML" in m["peak_source"]


def test_the_creep_rule_is_quiet_without_growth() -> None:
    assert creep(Evidence(memory_use=MemoryEvidence({0: gpu_rank()}))) == []


@pytest.mark.skipif(not SHARED_TRACES.is_dir(),
                    reason=f"the recorded traces are not here ({SHARED_TRACES})")
def test_a_trace_with_memory_events_gives_the_allocator_per_step() -> None:
    analysis = analyze_traces([SHARED_TRACES / "ddp_v100_rank1_of_2.json.gz"])
    [m] = verdict_data(analysis)["memory"]["ranks"]
    assert m["rank"] == 1 and m["device"] == "cuda"
    # what the trace's [memory] events say on its GPU (device 1), each of its 5 steps alike
    assert m["resident_bytes"] / GIB == pytest.approx(3.815, abs=0.01)
    assert m["allocator"]["allocated_peak_bytes"] / GIB == pytest.approx(6.174, abs=0.01)
    assert m["activations_bytes"] / GIB == pytest.approx(6.174 - 3.815, abs=0.01)
    assert "activations" in m["derived"]
    assert m["allocator"]["reserved_peak_bytes"] / GIB == pytest.approx(11.904, abs=0.01)
    assert m["capacity_bytes"] == 34089730048  # its deviceProperties: a V100-SXM2-32GB
    assert m["headroom_bytes"] / GIB == pytest.approx(31.75 - 11.904, abs=0.02)
    # the report's bar: what stays between steps (the trace has no optimizer to split it by)
    assert analysis.tables.memory is not None
    [kept] = analysis.tables.memory["between_steps_bytes"]
    assert kept / GIB == pytest.approx(3.815, abs=0.01)


def test_the_report_draws_the_memory_section(tmp_path: Path) -> None:
    from doctor.reports.html import render_html
    from doctor.reports.text import render_text

    record_gpu_run(tmp_path, 400, 64 * MIB)
    analysis = analyze_run(tmp_path)
    html = render_html(analysis)
    assert '<section id="memory">' in html and 'href="#memory"' in html
    assert "chart-memory" in html and "chart-memory-over-run" in html
    assert "frees about" in html  # the creep's fix says what it gives back
    assert "memory_over_run" not in html.split('id="doctor-verdict"')[0]  # a chart, not a table
    assert "Memory, rank 0:" in render_text(analysis)
