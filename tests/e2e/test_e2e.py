"""Real sample jobs under ``doctor run`` and ``doctor.watch``: the verdict's category and shares
on exaggerated bottlenecks. Proportions only, never times."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests import chrome_trace
from tests.support import SAMPLE_JOBS, doctor_cmd

pytestmark = pytest.mark.e2e


def run_job(tmp_path: Path, *args: str, name: str = "run") -> dict[str, Any]:
    out = tmp_path / name
    result = doctor_cmd("run", "--out", str(out), "--", *args)
    assert result.returncode == 0, result.stderr
    assert (out / "report.html").is_file()
    return dict(json.loads((out / "verdict.json").read_text()))


def finding_ids(verdict: dict[str, Any]) -> list[str]:
    return [f["id"] for f in verdict["findings"]]


def window_trace_verdict(run_dir: Path) -> dict[str, Any]:
    """``doctor report`` of the run's own profiler window, as a trace on its own."""
    [trace] = run_dir.glob("rank-0/main-*/trace.json.gz")
    result = doctor_cmd("report", str(trace), "--format", "json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_compute_bound_job(tmp_path: Path) -> None:
    verdict = run_job(tmp_path, sys.executable, str(SAMPLE_JOBS / "compute_bound.py"),
                      "--steps", "40")
    assert verdict["bottleneck"] == "compute"
    assert verdict["shares"]["compute"] > 0.6
    assert verdict["shares"]["preprocess"] < 0.15
    assert verdict["probes"]["torch_ops"]["ok"] is True
    assert verdict["probes"]["steps"]["ok"] is True
    assert verdict["probes"]["gpu"]["ok"] is False and verdict["probes"]["gpu"]["reason"]
    assert not [f for f in verdict["findings"] if f["id"].startswith("gpu.")]
    assert "gpus" in verdict["rules_skipped"]["gpu.starved"]  # no GPU rule fires on a CPU job
    assert verdict["probes"]["host"] == {"ok": True}  # asked again after the job has gone
    assert verdict["steps"]["count"] == 39
    assert "compute.bound" in finding_ids(verdict)
    assert window_trace_verdict(tmp_path / "run")["bottleneck"] == "compute"  # the other door
    # the report's imports while the job started (doctor.report_warmup, about a CPU second)
    # are a one-off, not the parent's sampling cost
    assert json.loads((tmp_path / "run" / "run.json").read_text())["sampler_cpu_s"] < 0.3


def test_input_bound_job(tmp_path: Path) -> None:
    # exaggerated: a small model; 60 steps, so that py-spy attaches while steps remain even on
    # a loaded machine (with 30, the split was missed once in CI: verdict "input")
    verdict = run_job(tmp_path, sys.executable, str(SAMPLE_JOBS / "input_bound.py"),
                      "--steps", "60", "--hidden", "256")
    assert verdict["bottleneck"] == "preprocess"
    assert verdict["shares"]["preprocess"] > 0.6
    assert verdict["probes"]["stacks"]["ok"] is True
    found = {f["id"]: f for f in verdict["findings"]}
    assert found["input.preprocess"]["estimated_speedup"] > 1.5
    loader = found["input.loader"]
    assert loader["category"] == "preprocess"
    assert loader["evidence"]["num_workers"] == 0
    assert "num_workers=" in loader["fixes"][0]["code"]
    assert loader["estimated_speedup"] > 1.3
    alone = window_trace_verdict(tmp_path / "run")  # the other door: input, not split by stage
    assert alone["bottleneck"] == "input"
    assert "input.unsplit" in finding_ids(alone)


def test_removing_the_input_bottleneck_removes_the_verdict(tmp_path: Path) -> None:
    verdict = run_job(tmp_path, sys.executable, str(SAMPLE_JOBS / "input_bound.py"),
                      "--steps", "30", "--cached")
    assert verdict["bottleneck"] == "compute"
    assert verdict["shares"]["preprocess"] < 0.3


def test_dataloader_workers_have_sessions_of_their_own(tmp_path: Path) -> None:
    # steps of 10 ms: 120 of them keep the workers alive long enough after the window opens
    # for the parent's next tick to start their stack recorders
    verdict = run_job(tmp_path, sys.executable, str(SAMPLE_JOBS / "input_bound.py"),
                      "--steps", "120", "--workers", "2", "--work", "300",
                      "--hidden", "256")
    workers = sorted(p.name.split("-")[0] for p in (tmp_path / "run" / "rank-0").iterdir()
                     if p.name.startswith("worker"))
    assert workers == ["worker0", "worker1"]
    assert list((tmp_path / "run" / "rank-0").glob("worker0-*/fetch.ring"))
    assert verdict["bottleneck"] == "preprocess"  # 2 workers on 2 cores cannot keep up
    loader = {f["id"]: f for f in verdict["findings"]}["input.loader"]
    assert loader["evidence"]["batch_tensors"] == 2  # images and labels, each handed over
    assert loader["evidence"]["batch_handoff_s"] > 0
    # the run on a time axis: each step once, each worker's fetches on its track, the window
    # inside its steps
    events = chrome_trace.check_run_timeline(tmp_path / "run")
    assert sum(e["name"].startswith("fetch: preprocess") for e in events) >= 30


def test_watch_decorator_and_context_manager(tmp_path: Path) -> None:
    job = tmp_path / "train.py"
    job.write_text(textwrap.dedent(f"""
        import sys
        import torch
        from torch import nn
        import doctor

        def loop(n):
            model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(n):
                loss = model(torch.randn(128, 256)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            return n

        @doctor.watch(out={str(tmp_path / 'deco')!r})
        def train():
            return loop(30)

        assert train() == 30

        @doctor.watch(out={str(tmp_path / 'fails')!r})
        def fails():
            loop(25)
            raise ValueError("the job's own error")

        try:
            fails()
        except ValueError as err:
            assert str(err) == "the job's own error"
        else:
            sys.exit("exception swallowed")

        with doctor.watch(out={str(tmp_path / 'ctx')!r}):
            loop(30)
        print("done")
    """))
    out = subprocess.run([sys.executable, str(job)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "done\n"
    for name in ("deco", "ctx"):
        verdict = json.loads((tmp_path / name / "verdict.json").read_text())
        assert verdict["bottleneck"] == "compute", name
        assert verdict["shares"]["compute"] > 0.5
        assert verdict["partial"] is False
        # watch samples the host and the GPU as doctor run does: no GPU here, and it says why
        assert verdict["probes"]["host"]["ok"]
        gpu = verdict["probes"]["gpu"]
        assert not gpu["ok"] and ("NVML" in gpu["reason"] or "pynvml" in gpu["reason"])
        assert "CPU jobs are analysed without them" in gpu["hint"] or "pip" in gpu["hint"]
        assert not [f for f in verdict["findings"] if f["id"].startswith("gpu.")]
        record = json.loads((tmp_path / name / "run.json").read_text())
        assert 0 <= record["sampler_cpu_s"] < record["duration_s"]
    failed = json.loads((tmp_path / "fails" / "verdict.json").read_text())
    assert failed["partial"] is True
    assert failed["steps"]["count"] == 24


def test_a_crash_mid_run_leaves_a_partial_report(tmp_path: Path) -> None:
    job = tmp_path / "crash.py"
    job.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        model = nn.Linear(64, 64)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(1000):
            loss = model(torch.randn(32, 64)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 29:
                raise RuntimeError("CUDA out of memory (pretend)")
    """))
    result = doctor_cmd("run", "--out", str(tmp_path / "run"), str(job))
    assert result.returncode == 1
    assert "RuntimeError: CUDA out of memory (pretend)" in result.stderr
    # doctor's progress lines: as the job starts, and as its window (steps 8-12) closes
    assert f"doctor: recording crash into {tmp_path / 'run'} (steps, " in result.stderr
    assert "doctor: deep window closed on rank 0" in result.stderr
    verdict = json.loads((tmp_path / "run" / "verdict.json").read_text())
    assert verdict["partial"] is True
    assert verdict["steps"]["count"] == 29
    assert "Rank 0 failed: RuntimeError: CUDA out of memory (pretend)" in verdict["notes"]
    assert (tmp_path / "run" / "report.html").is_file()


def test_host_contention_is_found(tmp_path: Path) -> None:
    spin = "import time\nt = time.time()\nwhile time.time() - t < 120: pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(3)]
    try:
        verdict = run_job(tmp_path, sys.executable, str(SAMPLE_JOBS / "compute_bound.py"),
                          "--steps", "30", "--threads", "4")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    [finding] = [f for f in verdict["findings"] if f["id"] == "host.contention"]
    assert finding["evidence"]["runnable_per_core"] >= 1.5
    assert finding["evidence"]["torch_threads_per_process"] == 4
    assert any("set_num_threads" in f["code"] for f in finding["fixes"])


@pytest.mark.parametrize("job, expected", [
    ("io_bound.py", "io"),
    ("decode_bound.py", "decode"),
    ("collate_bound.py", "preprocess"),
    ("pil_transforms.py", "preprocess"),  # Pillow's transforms, no codec: not decode
])
def test_input_stage_is_named(tmp_path: Path, job: str, expected: str) -> None:
    # a small model: an exaggerated input bottleneck
    verdict = run_job(tmp_path, sys.executable, str(SAMPLE_JOBS / job), "--steps", "40",
                      "--hidden", "256")
    assert verdict["bottleneck"] == expected
    assert verdict["shares"][expected] > 0.5
    found = {f["id"]: f for f in verdict["findings"]}
    assert found[f"input.{expected}"]["estimated_speedup"] > 1.5
    assert found["input.loader"]["category"] == expected


def test_many_small_files_get_shards_first(tmp_path: Path) -> None:
    """4 KiB files, one per sample, their pages dropped before each read: the reads are named
    small and many, and packing them into shards comes first."""
    verdict = run_job(tmp_path, sys.executable, str(SAMPLE_JOBS / "io_bound.py"),
                      "--file-mb", "0.004", "--files", "1024", "--batch", "64", "--steps", "150",
                      "--hidden", "128")
    io = {f["id"]: f for f in verdict["findings"]}["input.io"]
    assert "pack the small files into large shards" in io["fixes"][0]["title"]
    assert io["evidence"]["mean_read_kib"] < 64 and io["evidence"]["reads_per_s"] > 200
    assert io["evidence"]["cause"] == "small files"
    # its estimate: the reads' time saved, a floor (the calls around each file go too)
    assert io["fixes"][0]["estimated_speedup"] == pytest.approx(io["estimated_speedup"])
    assert io["estimated_speedup"] > 1.5


def test_a_remote_store_gets_more_requests_in_flight(tmp_path: Path) -> None:
    """Items fetched over HTTP from the job's own server on 127.0.0.1, 25 ms a request, two
    workers: the cause is a remote store, the fix more requests in flight (with an apply), and
    the parent saw the job's connections and the bytes they brought."""
    verdict = run_job(tmp_path, sys.executable, str(SAMPLE_JOBS / "http_loader.py"),
                      "--steps", "60")
    assert verdict["bottleneck"] == "io"
    io = {f["id"]: f for f in verdict["findings"]}["input.io"]
    assert io["evidence"]["cause"] == "remote store"
    first = io["fixes"][0]
    assert first["title"].startswith("A remote store:"), first["title"]
    assert first["apply"]["dataloader"]["num_workers"] > 2
    assert first["estimated_speedup"] > 1.5
    assert io["evidence"]["connections_in_flight"] > 0
    assert io["evidence"]["network_mb_per_s"] > 0
    assert (tmp_path / "run" / "data_files.npz").is_file()


def test_a_bursty_loader_gets_a_deeper_queue(tmp_path: Path) -> None:
    """One batch in 11 sleeps 40 ms in a worker; two workers keep up on average: prefetch_factor
    sized from the waits, with an apply, never more workers."""
    verdict = run_job(tmp_path, sys.executable, str(SAMPLE_JOBS / "bursty_loader.py"),
                      "--steps", "300")
    loader = {f["id"]: f for f in verdict["findings"]}["input.loader"]
    fix = loader["fixes"][0]
    assert fix["title"].startswith("Bursty batches:"), fix["title"]
    assert fix["apply"]["dataloader"]["prefetch_factor"] > 2
    assert loader["evidence"]["burst_steps"] >= 15


def test_a_queue_fed_by_a_thread_of_the_job_is_its_input(tmp_path: Path) -> None:
    """No DataLoader: a thread builds batches into a queue.Queue and the loop waits in get()."""
    verdict = run_job(tmp_path, sys.executable, str(SAMPLE_JOBS / "thread_loader.py"),
                      "--steps", "200")
    found = {f["id"]: f for f in verdict["findings"]}["input.outside_loader"]
    assert "on a queue that a thread of the job fills" in found["title"]
    assert found["evidence"]["queue_wait_share"] > 0.15
    assert verdict["shares"]["preprocess"] > 0.15


def test_workers_fall_back_to_sampling_themselves(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", sys.executable,
                        str(SAMPLE_JOBS / "decode_bound.py"), "--steps", "40", "--workers", "2",
                        "--hidden", "256", env={"DOCTOR_STACKS": "in-process"})
    assert result.returncode == 0, result.stderr
    verdict = json.loads((out / "verdict.json").read_text())
    recorders = {json.loads(p.read_text())["recorder"]
                 for p in out.glob("rank-0/worker*/stacks.json")}
    assert recorders == {"in-process"}
    assert verdict["probes"]["stacks"]["reason"] == \
        "in-process sampler (DOCTOR_STACKS=in-process)"
    assert verdict["bottleneck"] == "decode"


def test_batches_built_without_a_dataloader_are_input(tmp_path: Path) -> None:
    # 200 steps: stack sampling starts with the deep window and lasts seconds; 60 steps ended
    # before it in CI (every sample taken as the job exited, without a frame of the loop)
    verdict = run_job(tmp_path, sys.executable, str(SAMPLE_JOBS / "get_batch_bound.py"),
                      "--steps", "200")
    found = {f["id"]: f for f in verdict["findings"]}
    outside = found["input.outside_loader"]
    assert outside["evidence"]["share_of_step"] > 0.15
    assert verdict["shares"]["preprocess"] + verdict["shares"]["io"] > 0.15


def test_a_batch_of_many_tensors_is_named_for_its_handoff(tmp_path: Path) -> None:
    """One worker builds trivial batches of 32 tensors while the model trains on each for longer:
    it keeps up, and the training process's wait is taking them (exaggerated: 32 tensors)."""
    job = tmp_path / "train.py"
    job.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, Dataset

        class Fields(Dataset):
            def __len__(self):
                return 64 * 80

            def __getitem__(self, i):
                return {f"field{k}": torch.full((32,), float(i)) for k in range(32)}

        torch.set_num_threads(1)
        model = nn.Sequential(nn.Linear(32 * 32, 2048), nn.ReLU(), nn.Linear(2048, 2048),
                              nn.ReLU(), nn.Linear(2048, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for batch in DataLoader(Fields(), batch_size=64, num_workers=1, persistent_workers=True):
            x = torch.cat(list(batch.values()), dim=1)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """))
    verdict = run_job(tmp_path, sys.executable, str(job))
    found = {f["id"]: f for f in verdict["findings"]}
    handoff = found["input.handoff"]
    assert handoff["evidence"]["batch_tensors"] == 32
    assert handoff["estimated_speedup"] > 1.1
    assert "instead of 32" in handoff["fixes"][0]["title"]
    assert "workers keep up" in found["input.loader"]["fixes"][0]["title"]


def test_doctor_brings_nothing_heavy_into_the_job(tmp_path: Path) -> None:
    """The probes start with torch, but what they import is the recorder's (under its private
    name): no pandas, no analysis, no report code, nothing of the public doctor package."""
    job = tmp_path / "train.py"
    job.write_text(textwrap.dedent("""
        import sys
        import torch
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(12):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        heavy = ("pandas", "matplotlib", "jinja2", "_doctor_job.analyse", "_doctor_job.reports",
                 "doctor")
        print(sorted(m for m in sys.modules
                     if m.split(".")[0] in heavy or ".".join(m.split(".")[:2]) in heavy))
        print("_doctor_job.record.session" in sys.modules)
    """))
    result = doctor_cmd("run", "--out", str(tmp_path / "run"), "--window", "off", str(job))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "True"]  # recorded, and nothing heavy
