"""Step and overlap arithmetic on small hand-made traces (times in microseconds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from doctor.trace import intervals as iv
from doctor.trace.shares import SHARE_CATEGORIES, StepSpans, category_seconds, partition
from doctor.trace.steps import STEP_COLUMNS, trace_step_frame

DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def X(cat: str, name: str, ts: float, dur: float, tid: Any = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1 if cat in HOST else 0,
            "tid": tid, "ts": ts, "dur": dur, "args": args}


HOST = {"cpu_op", "user_annotation", "cuda_runtime", "python_function"}


def gpu_events() -> list[dict[str, Any]]:
    return [
        # step 1: [0, 1000)
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("user_annotation", DL, 0, 200),
        X("cpu_op", "aten::stack", 50, 100),
        X("cpu_op", "aten::to", 200, 100),
        X("cuda_runtime", "cudaMemcpyAsync", 210, 80),
        X("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 220, 80, tid=7, bytes=4096),
        X("cpu_op", "aten::mm", 300, 100),
        X("cuda_runtime", "cudaLaunchKernel", 310, 10),
        X("kernel", "volta_sgemm_128x64_nn", 320, 280, tid=7),
        X("cpu_op", "aten::item", 400, 250),
        X("cuda_runtime", "cudaStreamSynchronize", 410, 230),
        X("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 500, 50, tid=8, bytes=1024),
        X("user_annotation", "nccl:all_reduce", 650, 10),
        X("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 550, 250, tid=9),
        X("cpu_op", "aten::add", 800, 50),
        X("cuda_runtime", "cudaLaunchKernel", 805, 10),
        X("kernel", "void at::native::vectorized_elementwise_kernel<4>()", 850, 50, tid=7),
        X("cpu_op", "aten::zeros", 950, 30, tid=2),
        # step 2: [1000, 2000)
        X("user_annotation", "ProfilerStep#2", 1000, 1000),
        X("kernel", "void at::native::elementwise_kernel<128>()", 1000, 90, tid=7),
        X("cpu_op", "aten::item", 1000, 100),
        X("cuda_runtime", "cudaStreamSynchronize", 1010, 90),
        X("cpu_op", "aten::relu", 1250, 50),
        X("cuda_runtime", "cudaLaunchKernel", 1260, 10),
        X("kernel", "void at::native::relu_kernel()", 1300, 100, tid=7),
        X("kernel", "volta_h884gemm_256x128_ldg8_nn", 1500, 100, tid=7),
        # a GPU-side copy of the annotation must not become a step
        X("gpu_user_annotation", "ProfilerStep#2", 1000, 400, tid=7),
    ]


def write_trace(path: Path, events: list[dict[str, Any]], bare: bool = False, **top: Any) -> Path:
    path.write_text(json.dumps(events if bare else {**top, "traceEvents": events}))
    return path


@pytest.fixture
def gpu_frame(tmp_path: Path) -> pd.DataFrame:
    path = write_trace(tmp_path / "gpu.json", gpu_events(),
                       distributedInfo={"rank": 5, "world_size": 8},
                       deviceProperties=[{"name": "Tesla V100", "computeMajor": 7,
                                          "computeMinor": 0}])
    return trace_step_frame(path)


def us(value: float) -> Any:
    """Microseconds as the seconds the frame holds, compared with a tolerance."""
    return pytest.approx(value / 1e6, abs=1e-9)


def test_frame_has_every_column_typed(gpu_frame: pd.DataFrame) -> None:
    assert list(gpu_frame.columns) == list(STEP_COLUMNS)
    assert {c: str(t) for c, t in gpu_frame.dtypes.items()} == STEP_COLUMNS
    assert list(gpu_frame["step"]) == [1, 2]
    assert set(gpu_frame["rank"]) == {5}
    assert set(gpu_frame["device"]) == {"cuda"}
    assert set(gpu_frame["boundary"]) == {"profiler_step"}
    assert gpu_frame["gpu_cc"].iloc[0] == 7.0


def test_host_and_gpu_totals_of_a_step(gpu_frame: pd.DataFrame) -> None:
    s = gpu_frame.iloc[0]
    assert s["dur_s"] == us(1000)
    assert s["dataloader_s"] == us(200)
    assert s["cpu_op_s"] == us(530)  # 200-650 + 800-850 + 950-980 (other thread); DL excluded
    assert s["gpu_busy_s"] == us(610)  # 220-300, 320-800, 850-900
    assert s["gpu_idle_s"] == us(390)
    assert s["gpu_idle_input_s"] == us(200)
    assert s["gpu_idle_host_s"] == us(120)  # 200-220, 300-320, 800-850, 950-980
    assert s["kernel_s"] == us(330)
    assert s["kernel_count"] == 2  # collectives are not counted as compute kernels
    assert s["launch_count"] == 2


def test_copies_and_their_overlap(gpu_frame: pd.DataFrame) -> None:
    s = gpu_frame.iloc[0]
    assert s["htod_s"] == us(130)
    assert (s["htod_pageable_count"], s["htod_pinned_count"]) == (1, 1)
    assert s["htod_bytes"] == 4096 + 1024
    assert s["transfer_exposed_s"] == us(80)  # the pinned copy runs under the GEMM


def test_collectives_exposed_only_where_no_compute_runs(gpu_frame: pd.DataFrame) -> None:
    s = gpu_frame.iloc[0]
    assert s["comm_s"] == us(250)
    assert s["comm_exposed_s"] == us(200)  # 600-800: the GEMM hides 550-600


def test_syncs_their_source_and_the_bubble_after_them(gpu_frame: pd.DataFrame) -> None:
    one, two = gpu_frame.iloc[0], gpu_frame.iloc[1]
    assert one["sync_s"] == us(230)
    assert one["sync_count"] == 1
    assert one["sync_source"] == "cudaStreamSynchronize in aten::item"
    assert one["sync_bubble_s"] == us(0)  # the GPU was still busy when the sync returned
    assert two["sync_bubble_s"] == us(200)  # idle from 1100 until the relu kernel at 1300


def test_the_profilers_own_closing_sync_is_not_the_jobs(tmp_path: Path) -> None:
    """Stopping, the profiler synchronises the device inside whatever op the window closed in;
    no GPU work follows it in the trace, and the idle after it is the window's end."""
    closing = [X("cpu_op", "Optimizer.step#SGD.step", 1700, 280),
               X("cuda_runtime", "cudaDeviceSynchronize", 1900, 20)]
    frame = trace_step_frame(write_trace(tmp_path / "t.json", gpu_events() + closing))
    two = frame.iloc[1]
    assert two["sync_count"] == 1  # the .item() at 1010 only
    assert two["sync_bubble_s"] == us(200)
    assert two["sync_source"] == "cudaStreamSynchronize in aten::item"
    assert two["dur_s"] == us(900)  # the step ends where the profiler began to close


def test_tensor_core_classification(gpu_frame: pd.DataFrame) -> None:
    one, two = gpu_frame.iloc[0], gpu_frame.iloc[1]
    assert (one["gemm_s"], one["gemm_tensor_core_s"]) == (us(280), us(0))
    assert (two["gemm_s"], two["gemm_tensor_core_s"]) == (us(100), us(100))


def test_exclusive_split_follows_the_priorities(gpu_frame: pd.DataFrame) -> None:
    split = category_seconds(gpu_frame)
    assert list(split.columns) == list(SHARE_CATEGORIES)
    one = split.iloc[0]
    assert one["compute"] == us(450)  # 330 kernels + 120 host feeding an idle GPU
    assert one["communication"] == us(200)
    assert one["transfer"] == us(80)
    assert one["input"] == us(200)
    assert one["other"] == us(70)
    np.testing.assert_allclose(split.sum(axis=1), gpu_frame["dur_s"])


def test_old_category_names_and_bare_list_give_the_same_frame(
    tmp_path: Path, gpu_frame: pd.DataFrame
) -> None:
    rename = {"cpu_op": "Operator", "user_annotation": "Operator", "kernel": "Kernel",
              "gpu_memcpy": "Memcpy", "cuda_runtime": "Runtime"}
    old = []
    for ev in gpu_events():
        ev = dict(ev, cat=rename.get(ev["cat"], ev["cat"]), tid=str(ev["tid"]))
        if ev["cat"] == "gpu_user_annotation":
            continue  # torch 1.8 had no GPU-side annotations
        old.append(ev)
    frame = trace_step_frame(write_trace(tmp_path / "old.pt.trace.json", old, bare=True))
    skip = ("rank", "gpu_cc", "cpu_op_s")
    numeric = [c for c, t in STEP_COLUMNS.items() if t != "object" and c not in skip]
    pd.testing.assert_frame_equal(frame[numeric], gpu_frame[numeric], check_exact=False)
    # in 1.8 traces nccl:all_reduce is an Operator, so a host op: 650-660 joins 200-650
    assert frame["cpu_op_s"].iloc[0] == us(540)


def test_rocm_names(tmp_path: Path) -> None:
    events = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        X("cpu_op", "aten::copy_", 0, 40),
        X("cuda_runtime", "hipMemcpyWithStream", 5, 30),
        X("gpu_memcpy", "Memcpy HtoD (Host -> Device)", 10, 20, tid=0, kind="HtoD"),
        X("cpu_op", "aten::mm", 40, 20),
        X("cuda_runtime", "hipExtModuleLaunchKernel", 45, 5),
        X("kernel", "Cijk_Ailk_Bljk_SB_MT64x64x16", 50, 30, tid=0),
        X("cuda_runtime", "hipDeviceSynchronize", 60, 25),
        X("kernel", "Cijk_Ailk_Bljk_SB_MT64x64x16", 90, 5, tid=0),
    ]
    s = trace_step_frame(write_trace(tmp_path / "rocm.json", events)).iloc[0]
    assert s["device"] == "cuda"
    assert (s["kernel_count"], s["launch_count"], s["sync_count"]) == (2, 1, 2)
    assert s["htod_s"] == us(20)
    assert s["gpu_busy_s"] == us(55)


def test_steps_from_optimizer_annotations_when_no_profiler_steps(tmp_path: Path) -> None:
    opt = "Optimizer.step#SGD.step"
    events = [X("cpu_op", "aten::mm", 0, 50), X("user_annotation", opt, 80, 20),
              X("cpu_op", "aten::mm", 100, 50), X("user_annotation", opt, 180, 20)]
    frame = trace_step_frame(write_trace(tmp_path / "opt.json", events))
    assert list(frame["boundary"].unique()) == ["optimizer_step"]
    assert list(frame["dur_s"]) == [us(100), us(100)]
    assert list(frame["device"].unique()) == ["cpu"]


def test_whole_trace_is_one_step_as_a_last_resort(tmp_path: Path) -> None:
    events = [X("cpu_op", "aten::mm", 10, 50), X("cpu_op", "aten::add", 100, 10)]
    frame = trace_step_frame(write_trace(tmp_path / "flat.json", events))
    assert list(frame["boundary"]) == ["whole_trace"]
    assert frame["dur_s"].iloc[0] == us(100)
    assert frame["cpu_op_s"].iloc[0] == us(60)
    assert category_seconds(frame).iloc[0]["compute"] == us(60)


def test_no_events_gives_an_empty_typed_frame(tmp_path: Path) -> None:
    frame = trace_step_frame(write_trace(tmp_path / "empty.json", [{"ph": "M", "name": "x"}]))
    assert frame.empty
    assert {c: str(t) for c, t in frame.dtypes.items()} == STEP_COLUMNS
    assert category_seconds(frame).empty


def test_events_iterable_and_cpu_collective_exposure() -> None:
    events = [
        X("user_annotation", "ProfilerStep#3", 0, 100),
        X("user_annotation", "gloo:all_reduce", 10, 60, tid=9),  # background thread
        X("cpu_op", "aten::mm", 0, 30),
    ]
    s = trace_step_frame(iter(events), rank=2).iloc[0]
    assert (s["rank"], s["device"]) == (2, "cpu")
    assert s["comm_s"] == us(60)
    assert s["comm_exposed_s"] == us(40)  # 10-30 hidden behind the matmul
    split = category_seconds(pd.DataFrame([s]))
    assert split.iloc[0]["communication"] == us(40)
    assert split.iloc[0]["compute"] == us(30)


def test_category_seconds_from_totals_when_exclusive_columns_are_absent() -> None:
    frame = pd.DataFrame({"device": ["cuda"], "dur_s": [1.0], "gpu_busy_s": [0.6],
                          "comm_exposed_s": [0.1], "transfer_exposed_s": [0.05],
                          "dataloader_s": [0.2], "cpu_op_s": [0.5]})
    split = category_seconds(frame).iloc[0]
    # GPU compute 0.6 - 0.1 - 0.05; the host fills what input leaves of the idle 0.4
    assert split["compute"] == pytest.approx(0.45 + 0.2)
    assert split["input"] == pytest.approx(0.2)
    assert split.sum() == pytest.approx(1.0)


def test_interval_arithmetic() -> None:
    a = iv.union([0, 5, 2, 20], [3, 8, 4, 30])
    np.testing.assert_array_equal(a[0], [0, 5, 20])
    np.testing.assert_array_equal(a[1], [4, 8, 30])
    assert iv.length(a) == 17
    b = iv.union([3, 25], [6, 40])
    assert iv.length(iv.intersection(a, b)) == 1 + 1 + 5
    assert iv.length(iv.difference(a, b)) == 17 - 7
    assert iv.length(iv.union_of(a, b)) == 17 + 18 - 7
    assert iv.length(iv.clip(a, 2, 25)) == 2 + 3 + 5
    assert iv.length(iv.clip(a, 40, 50)) == 0
    assert iv.length(iv.union([], [])) == 0
    assert iv.count_starts(np.array([0.0, 1.0, 2.0, 3.0]), 1, 3) == 2
    touching = iv.difference(iv.union([0], [10]), iv.union([2, 4], [4, 6]))
    np.testing.assert_array_equal(touching[0], [0, 6])


def test_partition_sums_to_the_window() -> None:
    spans = StepSpans(
        window=iv.union([0], [100]), gpu_compute=iv.union([0], [50]),
        gpu_comm=iv.union([40], [70]), gpu_copy=iv.union([60], [80]),
        dataloader=iv.union([75], [90]), host_ops=iv.union([0], [95]),
    )
    parts = partition(spans)
    assert parts == pytest.approx({"compute": 55e-6, "communication": 20e-6, "transfer": 10e-6,
                                   "input": 10e-6, "other": 5e-6})


@pytest.fixture(scope="module")
def torch_cpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    path = tmp_path_factory.mktemp("cpu") / "cpu_trace.json"
    data = torch.utils.data.TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=1, warmup=1, active=4, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
            if i >= 7:
                break
    return path


def test_real_torch_cpu_trace(torch_cpu_trace: Path) -> None:
    frame = trace_step_frame(torch_cpu_trace)
    assert len(frame) == 4
    assert set(frame["device"]) == {"cpu"}
    assert (frame["dataloader_s"] > 0).all()
    assert (frame["cpu_op_s"] > 0).all()
    assert frame["gpu_idle_s"].isna().all()
    split = category_seconds(frame)
    np.testing.assert_allclose(split.sum(axis=1), frame["dur_s"], rtol=1e-9)
    np.testing.assert_allclose(split["compute"], frame["cpu_op_s"], rtol=1e-9)
    assert (split["transfer"] == 0).all()
