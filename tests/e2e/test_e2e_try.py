"""``doctor try`` end to end on real jobs: the setting reaches the job (the job itself prints
what it runs with), the job stops at the step asked, and the try measures a speedup, says
"nothing to change" for a value the job already has, and keeps the stderr of a fix that breaks
the job. Proportions and outcomes only, never times."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import (
    SAMPLE_JOBS,
    doctor_cmd,
    run_then_try,
    settings_seen,
    skip_if_the_cores_were_taken,
)

pytestmark = pytest.mark.e2e


INPUT_BOUND = ["python", str(SAMPLE_JOBS / "input_bound.py"), "--steps", "40"]


@pytest.fixture(scope="module")
def input_bound_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``doctor run`` of input_bound, which each test below copies and tries its own way
    (a try writes into the run directory it is given)."""
    root = tmp_path_factory.mktemp("input-bound")
    ran = doctor_cmd("run", "--out", str(root / "run"), "--", *INPUT_BOUND, cwd=root,
                     timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return root / "run"


def copy_of(run_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(run_dir, tmp_path / "run", symlinks=True)


def candidate(record: dict[str, Any], label: str) -> dict[str, Any]:
    return next(c for c in record["candidates"] if c["label"] == label)


@pytest.mark.usefixtures("two_cores")
def test_workers_fix_of_the_input_bound_job_is_measured(input_bound_run: Path,
                                                        tmp_path: Path) -> None:
    copy_of(input_bound_run, tmp_path)
    # 10 tried steps measured 1.11x once in CI, and 20 steps once each 1.06x: the median of
    # two rounds each. The workers' fix alone (the plan's other fixes, together: tests/unit)
    run_dir, record = run_then_try(tmp_path, INPUT_BOUND, "--fix", "input.loader:1", "--steps",
                                   "20", "--repeat", "2")
    try_dir = run_dir / record["dir"].split(str(run_dir) + "/")[-1]
    workers = next(c for c in record["candidates"] if c["id"] == "input.loader:1")
    assert workers["apply"]["dataloader"]["num_workers"] == 2
    assert workers["estimate"] > 1.2
    if workers["speedup"] <= 1.2 or workers["outcome"] != "faster":  # (once in CI: 1.06x, the
        # machine's second core taken; once rounds that disagreed, a helper's tests beside it)
        skip_if_the_cores_were_taken(f"num_workers=2 measured {workers['speedup']:.2f}x "
                                     f"({workers['outcome']})")
    assert workers["outcome"] == "faster"
    assert workers["speedup"] > 1.2
    assert workers["ratio"] == pytest.approx(workers["speedup"] / workers["estimate"])
    attempt = workers["attempts"][0]
    seen = settings_seen(try_dir / attempt)
    assert (seen["num_workers"], seen["persistent_workers"]) == (2, True)
    base = try_dir / record["baseline"]["rounds"][0]["dir"]
    assert settings_seen(base)["num_workers"] == 0
    for folder in (base, try_dir / attempt):
        main = json.loads(next(folder.glob("rank-0/main-*/meta.json")).read_text())
        assert main["stopped_at_step"] == record["stop_at_step"]  # it stopped where asked
        verdict = json.loads((folder / "verdict.json").read_text())
        assert verdict["steps"]["count"] == record["stop_at_step"] - 1
        assert verdict["job"]["exit_code"] == 0
        for meta in folder.glob("rank-*/*/meta.json"):  # workers included: all gone
            assert not psutil.pid_exists(json.loads(meta.read_text())["pid"])
    fixes = {f["title"]: f for finding in json.loads((run_dir / "verdict.json").read_text())
             ["findings"] for f in finding["fixes"]}
    verified = next(f["verified"] for f in fixes.values() if f.get("apply") ==
                    workers["apply"])
    assert verified["speedup"] == pytest.approx(workers["speedup"], rel=1e-3)
    text = doctor_cmd("report", str(run_dir), "--format", "text", cwd=tmp_path).stdout
    assert "verified: measured" in text
    assert (try_dir / "report.html").is_file()
    compared = doctor_cmd("compare", str(base), str(try_dir / attempt), "--format", "json")
    # the first round of each, so the first round's speedup (the try's is the median of the
    # rounds': once in CI 1.14x in the first round against 1.45x over both)
    assert json.loads(compared.stdout)["speedup"] == pytest.approx(workers["per_round"][0],
                                                                   rel=0.05)


def test_a_value_the_job_already_sets_and_a_sweep_that_reaches_it(input_bound_run: Path,
                                                                  tmp_path: Path) -> None:
    copy_of(input_bound_run, tmp_path)
    command = INPUT_BOUND
    # input_bound calls torch.set_num_threads(1) itself
    _, threads = run_then_try(tmp_path, command, "--set", "num_threads=1", "--steps", "10",
                              "--repeat", "1")
    [only] = threads["candidates"]
    assert only["outcome"] == "unchanged", only
    run_dir, pinned = run_then_try(tmp_path, command, "--set", "pin_memory=true,false",
                                   "--steps", "10", "--repeat", "1")
    assert pinned["sweep"]
    try_dir = run_dir / pinned["dir"].split(str(run_dir) + "/")[-1]
    assert candidate(pinned, "pin_memory=False")["outcome"] == "unchanged"
    on = candidate(pinned, "pin_memory=True")
    assert settings_seen(try_dir / on["attempts"][0])["pin_memory"] is True
    assert on["applied"]["dataloader.pin_memory"]["job"] == ["False"]


LIBRARY = '''
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        if BROKEN_IN_WORKERS and torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("this dataset cannot run in worker processes")
        time.sleep(0.004)  # reading a file: workers overlap it whatever the cores are doing
        return torch.full((8,), float(i)), i % 2


BROKEN_IN_WORKERS = False


def make_loader(broken=False):
    global BROKEN_IN_WORKERS
    BROKEN_IN_WORKERS = broken
    return DataLoader(Slow(), batch_size=8)
'''

TRAIN = '''
import json, sys
import torch
from mylib import make_loader

torch.set_num_threads(1)  # a tiny model: its threads would only take the workers' cores
loader = make_loader(broken="--broken" in sys.argv)
print(json.dumps({"settings": {"num_workers": loader.num_workers}}), flush=True)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 39:
        break
'''


def library_job(tmp_path: Path) -> None:
    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text(textwrap.dedent(LIBRARY))
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))


def test_a_dataloader_built_in_a_library_gets_the_setting(tmp_path: Path) -> None:
    library_job(tmp_path)
    # 20 tried steps: with 10, the workers' start-up on a loaded 2-core machine can leave the
    # measured steps within the noise band ("no change", seen once in CI). Its items wait (as
    # on a disk) rather than compute: two workers halve the wait even when the machine's second
    # core is taken ("slower" once in CI when the items were a CPU loop)
    run_dir, record = run_then_try(tmp_path, ["python", "train.py"], "--set", "num_workers=2",
                                   "--steps", "20", "--repeat", "1")
    [c] = record["candidates"]
    try_dir = run_dir / record["dir"].split(str(run_dir) + "/")[-1]
    assert settings_seen(try_dir / c["attempts"][0])["num_workers"] == 2
    assert c["outcome"] == "faster", c  # loading is most of the step: workers hide it


def test_a_fix_that_breaks_the_job_says_so_and_keeps_its_stderr(tmp_path: Path) -> None:
    library_job(tmp_path)
    _, record = run_then_try(tmp_path, ["python", "train.py", "--broken"],
                             "--set", "num_workers=1", "--steps", "10", "--repeat", "2")
    [c] = record["candidates"]
    assert c["outcome"] == "failed"
    assert "cannot run in worker processes" in c["stderr_tail"]
    assert len(c["attempts"]) == 1  # a failed setting is not run again in later rounds
    assert len(record["baseline"]["rounds"]) == 2


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: no thread count to raise")
def test_the_thread_count_fix_of_a_compute_bound_job(tmp_path: Path) -> None:
    run_dir, record = run_then_try(
        tmp_path, ["python", str(SAMPLE_JOBS / "compute_bound.py"), "--steps", "30",
                   "--threads", "1"],
        "--fix", "compute.bound", "--steps", "10", "--repeat", "1")
    [c] = [c for c in record["candidates"] if "num_threads" in c["label"]]
    try_dir = run_dir / record["dir"].split(str(run_dir) + "/")[-1]
    cores = json.loads((run_dir / "run.json").read_text())["cores"]
    # the job calls torch.set_num_threads(1) itself; the try's value is the one it runs with
    assert settings_seen(try_dir / c["attempts"][0])["torch_threads"] == cores
    assert c["applied"]["torch.num_threads"]["asked"] == 1
    assert c["speedup"] is not None
