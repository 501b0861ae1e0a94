"""GPU rules on hand-made step and memory frames; every fix's code is valid Python."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from doctor.analyse.gpus import GpuCounters, GpuSummary
from doctor.analyse.kind_scaling import ddp_scaling
from doctor.rules import Evidence, Rule, communication, gpu, run_rules
from doctor.rules import memory as memory_rules
from doctor.trace.steps import empty_step_frame
from doctor.verdict import Finding
from tests.support import comm_model, evidence, steps

#: The rules over the profiler window and the allocator, the ones under test here.
GPU_RULES = [r for module in (gpu, communication, memory_rules) for r in vars(module).values()
             if isinstance(r, Rule)]
GPU_RULE_IDS = {r.id for r in GPU_RULES}

GIB = 1 << 30


def run(frame: pd.DataFrame | None = None, memory: pd.DataFrame | None = None,
        **facts: Any) -> list[Finding]:
    return run_rules(evidence(window=frame, memory=memory, **facts), GPU_RULES).findings


def ids(findings: list[Finding]) -> set[str]:
    return {f.id for f in findings}


def test_a_healthy_gpu_step_has_no_findings() -> None:
    assert run(steps()) == []


def test_the_analysis_runs_every_gpu_rule() -> None:
    from doctor.rules import default_rules

    assert {r.id for r in default_rules()} >= GPU_RULE_IDS
    assert {"gpu.pageable_copy", "gpu.transfer_exposed", "gpu.host_sync", "gpu.launch_bound",
            "gpu.no_tensor_cores", "comm.exposed", "comm.scaling",
            "memory.fragmentation"} == GPU_RULE_IDS


def test_pageable_copies() -> None:
    (f,) = run(steps(htod_pageable_count=12, htod_s=0.01, transfer_s=0.01,
                     transfer_exposed_s=0.01, htod_bytes=12 << 20))
    assert f.id == "gpu.pageable_copy"
    assert f.category == "transfer"
    assert f.evidence["htod_pageable_per_step"] == 12
    assert f.evidence["transfer_exposed_share"] == pytest.approx(0.1)
    assert f.estimated_speedup == pytest.approx(0.1 / 0.09)
    assert any("pin_memory=True" in fx.code for fx in f.fixes)
    assert any("non_blocking=True" in fx.code for fx in f.fixes)


def test_pageable_copy_fix_knows_the_loader_already_pins() -> None:
    (f,) = run(steps(htod_pageable_count=2, transfer_exposed_s=0.001),
               loaders=pd.DataFrame([{"pin_memory": True, "num_workers": 2}]))
    assert "already has pin_memory=True" in f.fixes[0].why


def test_exposed_pinned_transfers() -> None:
    (f,) = run(steps(htod_pinned_count=20, transfer_s=0.011, transfer_exposed_s=0.004))
    assert f.id == "gpu.transfer_exposed"
    assert f.evidence["overlapped_fraction"] == pytest.approx(1 - 4 / 11)


def test_host_sync_with_its_source() -> None:
    (f,) = run(steps(sync_count=3, sync_s=0.02, sync_bubble_s=0.01,
                     sync_source="cudaStreamSynchronize in aten::item (train.py(42): step)"))
    assert f.id == "gpu.host_sync"
    assert "aten::item" in f.title and "train.py(42)" in f.title
    assert f.estimated_speedup == pytest.approx(0.1 / 0.09)


@pytest.mark.parametrize(("counts", "said"), [([3] * 5, "3 host syncs per step"),
                                              ([1] * 5, "1 host sync per step"),
                                              ([1, 0, 0, 0, 0], "1 host sync every 5 steps")])
def test_the_sync_rate_is_said_as_counted(counts: list[int], said: str) -> None:
    frame = steps(5, sync_s=0.02, sync_bubble_s=0.01)
    frame["sync_count"] = counts
    (f,) = run(frame)
    assert f.title.startswith(said)


def test_syncs_that_cost_nothing_are_not_reported() -> None:
    assert run(steps(sync_count=3, sync_s=0.02, sync_bubble_s=0.0001)) == []


def test_kernels_replayed_from_a_cuda_graph_are_not_launch_bound() -> None:
    """One cudaGraphLaunch runs thousands of kernels: the fix is already in place (the H200's
    gpu_launch_bound --fixed: 2030 kernels, 5 launch calls a step)."""
    assert run(steps(gpu_busy_s=0.03, kernel_s=0.03, gpu_idle_s=0.07, gpu_idle_host_s=0.06,
                     kernel_count=2030, kernel_median_us=1.3, launch_count=5)) == []


def nvml_busy(util: float) -> GpuCounters:
    """What NVML saw of rank 0's GPU over the run: busy ``util`` of the time."""
    nan = float("nan")
    gpu = GpuSummary(node=0, index=0, name="", uuid="", samples=20, util=util,
                     mem_used_mean_bytes=nan, mem_used_max_bytes=nan, mem_total_bytes=nan,
                     pcie_rx_bytes_s=nan, pcie_tx_bytes_s=nan, pcie_link_bytes_s=nan,
                     sm_clock_mhz=nan, sm_clock_max_mhz=nan, power_w=nan, power_limit_w=nan,
                     power_limit_max_w=nan, temp_max_c=nan, power_throttled=nan,
                     thermal_throttled=nan, hw_slowdown=nan, ranks=(0,))
    return GpuCounters(gpus=(gpu,), rank_gpu={0: (0, 0)}, mapped_by="nvml processes",
                       samples=pd.DataFrame())


def test_launch_bound_gains_no_more_than_the_gpus_idle_over_the_run() -> None:
    """The window's steps carry the profiler's host cost: its idle share overstates the run's
    (the H200's conv_layout: 23 % idle in the window, NVML 18 % over the run)."""
    frame = steps(gpu_busy_s=0.03, kernel_s=0.03, gpu_idle_s=0.07, gpu_idle_host_s=0.06,
                  kernel_count=3000, kernel_median_us=4.0)
    (free,) = run(frame)
    (bounded,) = run(frame, gpus=nvml_busy(0.8))
    assert free.estimated_speedup == pytest.approx(0.1 / 0.04)
    assert bounded.estimated_speedup == pytest.approx(1 / 0.8)


def test_launch_bound() -> None:
    (f,) = run(steps(gpu_busy_s=0.03, kernel_s=0.03, gpu_idle_s=0.07, gpu_idle_host_s=0.06,
                     kernel_count=3000, kernel_median_us=4.0))
    assert f.id == "gpu.launch_bound"
    assert f.severity == "critical"
    assert f.evidence["kernel_median_us"] == 4.0
    assert f.estimated_speedup == pytest.approx(0.1 / 0.04)
    codes = " ".join(fx.code for fx in f.fixes)
    assert "torch.compile" in codes and "reduce-overhead" in codes and "batch_size" in codes


@pytest.mark.parametrize(("cc", "tf32"), [(8.0, True), (7.0, False), (float("nan"), True)])
def test_fp32_gemms_without_tensor_cores(cc: float, tf32: bool) -> None:
    (f,) = run(steps(gemm_s=0.06, gemm_tensor_core_s=0.0, gpu_cc=cc))
    assert f.id == "gpu.no_tensor_cores"
    codes = "\n".join(fx.code for fx in f.fixes)
    assert "torch.autocast" in codes
    assert ("torch.backends.cuda.matmul.allow_tf32 = True" in codes) is tf32
    assert ("GradScaler" in codes) is (not tf32)
    assert f.estimated_speedup == pytest.approx(0.1 / 0.07)


@pytest.mark.parametrize("values", [
    {"gemm_s": 0.06, "gemm_tensor_core_s": 0.05},  # Tensor Cores already used
    {"gemm_s": 0.06, "gpu_cc": 6.1},  # Pascal: none to use
    {"gemm_s": 0.01},  # GEMMs are a small part
    {"gemm_s": 0.06, "gpu_name": "AMD Instinct MI250X"},  # ROCm names do not tell
])
def test_tensor_core_rule_stays_quiet(values: dict[str, Any]) -> None:
    assert run(steps(**values)) == []


def test_exposed_communication_gpu_and_cpu() -> None:
    (f,) = run(steps(comm_s=0.04, comm_exposed_s=0.03), world_size=16)
    assert f.id == "comm.exposed"
    assert f.category == "communication"
    assert f.severity == "critical"
    assert f.evidence["world_size"] == 16
    assert f.evidence["comm_overlapped_fraction"] == pytest.approx(0.25)
    assert f.evidence["step_s"] == pytest.approx(0.1)  # the step's own seconds, not a share
    assert f.estimated_speedup == pytest.approx(0.1 / 0.07)
    codes = "\n".join(fx.code for fx in f.fixes)
    assert "bucket_cap_mb" in codes and "no_sync" in codes and "compress_hook" in codes
    cpu = steps(device="cpu", gpu_busy_s=0.0, comm_s=0.05, comm_exposed_s=0.05)
    assert ids(run(cpu)) == {"comm.exposed"}


def test_waiting_for_a_straggler_is_not_exposed_communication_twice() -> None:
    from doctor.analyse.distributed import Straggler, StragglerSearch

    def search(wait_s: float) -> StragglerSearch:
        return StragglerSearch([Straggler(rank=1, extra_s=wait_s, step_s=0.1,
                                          slower_fraction=1.0, steps=4, cause="input",
                                          cause_category="preprocess", waiting={0: wait_s})])

    two = pd.concat([steps(comm_s=0.04, comm_exposed_s=0.04).assign(rank=r) for r in (0, 1)])
    # rank 0 waits 60 ms a step for rank 1: over both ranks, 30 ms of the 40 ms exposed
    (f,) = run(two, stragglers=search(0.06))
    assert f.evidence["waiting_for_straggler_s_per_step"] == pytest.approx(0.03)
    assert f.evidence["comm_exposed_s_per_step"] == pytest.approx(0.01)
    assert f.estimated_speedup == pytest.approx(0.1 / 0.09)
    # all of it waiting: the straggler's finding says it, comm.exposed stays quiet
    assert run(two, stragglers=search(0.08)) == []


def test_only_analysed_steps_count() -> None:
    frame = steps(comm_s=0.05, comm_exposed_s=0.05)
    frame["analyzed"] = False
    assert run(frame) == []


def memory(**values: Any) -> pd.DataFrame:
    base = {"t_s": [0.0, 1.0, 2.0], "allocated_bytes": [4 * GIB, 6 * GIB, 5 * GIB],
            "reserved_bytes": [5 * GIB, 10 * GIB, 10 * GIB],
            "inactive_split_bytes": [0, 3 * GIB, 2 * GIB],
            "alloc_retries": [0, 0, 0], "num_ooms": [0, 0, 0]}
    base.update(values)
    return pd.DataFrame(base)


def test_fragmentation_with_the_bytes_it_would_free() -> None:
    (f,) = run(memory=memory(alloc_retries=[0, 2, 5]))
    assert f.id == "memory.fragmentation"
    assert f.severity == "warning"
    assert f.evidence["would_free_bytes"] == 3 * GIB
    assert f.evidence["alloc_retries"] == 5
    assert f.evidence["peak_reserved_bytes"] == 10 * GIB
    assert "expandable_segments:True" in f.fixes[0].code
    assert "3072 MiB" in f.fixes[0].why


def test_fragmentation_out_of_memory_is_critical() -> None:
    (f,) = run(memory=memory(num_ooms=[0, 0, 1]))
    assert f.severity == "critical"


def test_an_oom_without_split_blocks_is_not_called_fragmentation() -> None:
    # PyTorch suggests expandable_segments on every OOM; doctor only where blocks are split
    assert run(memory=memory(inactive_split_bytes=[0, 0, 0], num_ooms=[0, 0, 1])) == []
    assert run(memory=memory(inactive_split_bytes=[0, 0, 0], alloc_retries=[0, 3, 9])) == []


def test_no_fragmentation_no_finding_and_missing_columns_skip() -> None:
    assert run(memory=memory(inactive_split_bytes=[0, 1 << 20, 0])) == []
    outcome = run_rules(Evidence(memory=pd.DataFrame({"t_s": [0.0]})), [memory_rules.fragmentation])
    assert "lack" in outcome.skipped["memory.fragmentation"]


def test_missing_or_empty_inputs_are_skipped_not_raised() -> None:
    outcome = run_rules(Evidence(window=empty_step_frame()), GPU_RULES)
    assert outcome.findings == []
    assert set(outcome.skipped) == GPU_RULE_IDS
    assert not any("rule failed" in why for why in outcome.skipped.values())


def everything() -> list[Finding]:
    frame = steps(htod_pageable_count=4, transfer_s=0.02, transfer_exposed_s=0.01,
                  sync_count=2, sync_bubble_s=0.01, gpu_idle_host_s=0.05, kernel_count=2000,
                  gemm_s=0.05, comm_s=0.03, comm_exposed_s=0.03)
    found = run(frame, memory(alloc_retries=[0, 0, 1]), world_size=4)
    found += run(steps(htod_pinned_count=5, transfer_s=0.02, transfer_exposed_s=0.01))
    found += run(steps(gemm_s=0.06, gpu_cc=7.0))

    models = {0: comm_model()}
    found += run(comm_models=models, scaling=ddp_scaling(models))
    return found


def test_every_rule_fires_somewhere_and_every_fix_compiles() -> None:
    found = everything()
    assert ids(found) == GPU_RULE_IDS
    for finding in found:
        assert finding.fixes, finding.id
        assert finding.title and finding.evidence
        finding.to_dict()  # JSON-friendly
        for fix in finding.fixes:
            assert fix.title and fix.why
            compile(fix.code, f"<{finding.id}: {fix.title}>", "exec")
