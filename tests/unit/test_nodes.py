"""Several nodes, one run directory: which node a doctor run is (doctor.nodes), the node folders
and the claim of the one node that merges them (doctor.store), and the doors on such a folder
(doctor run, report, try). Recorded loops on fake clocks and plain-Python jobs; no torch job."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from doctor.errors import UsageError
from doctor.nodes import Node, node_of, torchrun_args
from doctor.outputs import finish_node
from doctor.store import layout
from doctor.store.rundir import (
    claim_merge,
    is_job_dir,
    job_nodes,
    newest_run,
    write_node_record,
)
from tests.support import fake_node, record_node, write_record

TORCHRUN = ["torchrun", "--nproc-per-node", "2"]

# ----- which node: doctor.nodes ------------------------------------------------------------


@pytest.mark.parametrize("args, node", [
    (["--nnodes", "2", "--node-rank", "1"], Node(1, 2)),
    (["--nnodes=2", "--node-rank=1"], Node(1, 2)),
    (["--node_rank", "1", "--nnodes", "2"], Node(1, 2)),
    (["--node_rank=0", "--nnodes=4"], Node(0, 4)),
    (["--nnodes", "1:4", "--node-rank", "3"], Node(3, 4)),  # elastic: MAX nodes
    (["--nnodes", "1"], None),
    (["--nnodes", "1", "--node-rank", "0"], None),
    ([], None),  # torchrun's default is one node
    (["--standalone"], None),
])
def test_torchrun_arguments(args: list[str], node: Node | None) -> None:
    assert node_of([*TORCHRUN, *args, "train.py", "--lr", "0.1"], {}) == node


def test_the_scripts_own_arguments_are_not_torchruns() -> None:
    argv = [*TORCHRUN, "--standalone", "train.py", "--nnodes", "4", "--node-rank", "2"]
    assert torchrun_args(argv) == ["--nproc-per-node", "2", "--standalone"]
    assert node_of(argv, {}) is None
    assert node_of(["python", "train.py", "--nnodes", "2", "--node-rank", "1"], {}) is None


def test_torchrun_as_a_python_module_and_from_its_environment() -> None:
    argv = ["python", "-u", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1",
            "train.py"]
    assert node_of(argv, {}) == Node(1, 2)
    assert node_of(["/usr/bin/torchrun", "train.py"],
                   {"PET_NNODES": "3", "PET_NODE_RANK": "2"}) == Node(2, 3)
    assert node_of(["torchrun", "--nnodes", "2", "--node-rank", "0", "train.py"],
                   {"PET_NNODES": "3", "PET_NODE_RANK": "2"}) == Node(0, 2)  # argv first
    assert node_of(["python", "train.py", "-m", "torch.distributed.run"], {}) is None


def test_doctors_own_variables_win() -> None:
    env = {"DOCTOR_NODE_RANK": "2", "DOCTOR_NNODES": "3", "SLURM_NODEID": "0",
           "SLURM_JOB_NUM_NODES": "2"}
    assert node_of(["torchrun", "--nnodes", "2", "--node-rank", "1", "t.py"], env) == Node(2, 3)
    assert node_of(["python", "t.py"], env) == Node(2, 3)
    assert node_of(["python", "t.py"], {"DOCTOR_NNODES": "1", "SLURM_NODEID": "1",
                                        "SLURM_JOB_NUM_NODES": "2"}) is None
    # each value from the first source that has it: the rank here, the count from torchrun
    assert node_of(["torchrun", "--nnodes", "2", "t.py"], {"DOCTOR_NODE_RANK": "1"}) == Node(1, 2)


def test_slurm_then_open_mpi_then_pmi() -> None:
    slurm = {"SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2"}
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}
    pmi = {"PMI_RANK": "0", "PMI_SIZE": "3"}
    job = ["python", "train.py"]
    assert node_of(job, slurm) == Node(1, 2)
    assert node_of(job, {"SLURM_NODEID": "1", "SLURM_NNODES": "2"}) == Node(1, 2)
    assert node_of(job, ompi) == Node(2, 4)
    assert node_of(job, pmi) == Node(0, 3)
    assert node_of(job, {**pmi, **ompi, **slurm}) == Node(1, 2)
    assert node_of(job, {**pmi, **ompi}) == Node(2, 4)
    # srun -N1 inside a larger allocation: the step's nodes count
    assert node_of(job, {**slurm, "SLURM_NODEID": "0", "SLURM_STEP_NUM_NODES": "1"}) is None
    assert node_of(job, {"SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1"}) is None
    # a torchrun of one node is one node, whatever the allocation
    assert node_of(["torchrun", "--nproc-per-node", "2", "train.py"], slurm) is None
    # an elastic torchrun leaves the node's rank to the scheduler
    assert node_of(["torchrun", "--nnodes", "2:2", "--rdzv-backend", "c10d", "train.py"],
                   slurm) == Node(1, 2)


def test_no_nodes_said_is_one_node() -> None:
    assert node_of(["python", "train.py"], {}) is None
    assert node_of([], {}) is None


@pytest.mark.parametrize("env", [
    {"DOCTOR_NODE_RANK": "one", "DOCTOR_NNODES": "two"},
    {"DOCTOR_NODE_RANK": "-1", "DOCTOR_NNODES": "0"},
    {"DOCTOR_NODE_RANK": "", "DOCTOR_NNODES": "2:3"},  # MIN:MAX is torchrun's, not doctor's
    {"DOCTOR_NODE_RANK": "1.0", "DOCTOR_NNODES": "-2"},
])
def test_malformed_values_are_ignored(env: dict[str, str]) -> None:
    slurm = {"SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "3"}
    assert node_of(["python", "train.py"], {**env, **slurm}) == Node(1, 3)
    assert node_of(["python", "train.py"], env) is None


@pytest.mark.parametrize("nnodes", ["x", "0", "3:2", "-1", "2:x"])
def test_a_malformed_torchrun_count_is_ignored(nnodes: str) -> None:
    argv = ["torchrun", "--nnodes", nnodes, "--node-rank", "1", "train.py"]
    assert node_of(argv, {"SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2"}) == Node(1, 2)
    assert node_of(argv, {}) is None


def test_several_nodes_without_a_rank_or_with_one_too_high_say_what_to_set() -> None:
    with pytest.raises(UsageError, match="cannot tell which node this is: set DOCTOR_NODE_RANK"):
        node_of(["torchrun", "--nnodes", "2", "train.py"], {})
    with pytest.raises(UsageError, match=r"node rank 2 \(torchrun --node-rank\) is not below "
                                         r"the number of nodes 2 \(torchrun --nnodes\)"):
        node_of(["torchrun", "--nnodes", "2", "--node-rank", "2", "train.py"], {})


# ----- the node folders and the merge: doctor.store, doctor.outputs ------------------------


def test_node_folders_in_node_order(tmp_path: Path) -> None:
    for name in ("node-10", "node-2", "node-x", "rank-0"):
        (tmp_path / name).mkdir()
    (tmp_path / "node-3").write_text("")  # a file, not a folder
    assert [n for n, _ in layout.node_dirs(tmp_path)] == [2, 10]
    assert layout.node_of_dir(tmp_path / "node-7") == 7
    assert layout.node_of_dir(tmp_path / "nodes-7") is None


def test_how_far_each_node_has_got(tmp_path: Path) -> None:
    fake_node(tmp_path, 0, 3)
    fake_node(tmp_path, 1, 3, ended=True, done=False)
    fake_node(tmp_path, 2, 3, ended=False, done=False)
    nodes = job_nodes(tmp_path)
    assert nodes.nnodes == 3 and nodes.missing == []
    assert (nodes.ended, nodes.done) == ({0, 1}, {0})
    assert nodes.running == [2]
    assert not nodes.complete
    assert [d.name for d in nodes.dirs] == ["node-0", "node-1", "node-2"]
    write_node_record(tmp_path / "node-1", 1, 3, done=True)
    write_record(tmp_path / "node-2", exit_code=1)
    write_node_record(tmp_path / "node-2", 2, 3, done=True)
    assert job_nodes(tmp_path).complete


def test_a_node_that_never_started_is_missing(tmp_path: Path) -> None:
    fake_node(tmp_path, 1, 3)
    nodes = job_nodes(tmp_path)
    assert (nodes.nnodes, nodes.missing, nodes.complete) == (3, [0, 2], False)
    assert job_nodes(tmp_path, nnodes=4).missing == [0, 2, 3]
    (tmp_path / "node-0").mkdir()  # made, but its run never wrote a record
    assert job_nodes(tmp_path).missing == [0, 2]


def test_only_one_claim_of_a_merge_wins(tmp_path: Path) -> None:
    fake_node(tmp_path, 0)
    fake_node(tmp_path, 1)
    nodes = job_nodes(tmp_path)
    assert claim_merge(nodes) is True
    assert claim_merge(nodes) is False
    assert claim_merge(job_nodes(tmp_path)) is False  # the same node runs, seen again


def test_racing_claims_have_one_winner(tmp_path: Path) -> None:
    fake_node(tmp_path, 0)
    fake_node(tmp_path, 1)
    nodes = job_nodes(tmp_path)
    start = threading.Barrier(8)
    wins: list[bool] = []

    def claim() -> None:
        start.wait()
        wins.append(claim_merge(nodes))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]


def test_the_same_directory_run_again_is_merged_again(tmp_path: Path) -> None:
    fake_node(tmp_path, 0)
    fake_node(tmp_path, 1)
    assert claim_merge(job_nodes(tmp_path))
    fake_node(tmp_path, 1, t0_s=2000.0)  # node 1 ran again
    assert claim_merge(job_nodes(tmp_path))


def test_no_merge_until_every_node_is_done(tmp_path: Path) -> None:
    node0 = record_node(tmp_path, 0, done=False)
    record_node(tmp_path, 1, ended=False, done=False)
    first = finish_node(tmp_path, node0, Node(0, 2))
    assert first.merged is None and first.waiting_for == [1]
    assert json.loads((node0 / layout.NODE_RECORD).read_text())["done"] is True
    assert not (tmp_path / layout.VERDICT).exists()
    assert not list(tmp_path.glob(".merge-*"))
    assert not (tmp_path / layout.NODES_RECORD).exists()


def test_the_last_node_to_finish_writes_the_jobs_verdict(tmp_path: Path) -> None:
    node0 = record_node(tmp_path, 0, done=False)
    node1 = record_node(tmp_path, 1, done=False, t0_s=5000.0)
    assert finish_node(tmp_path, node0, Node(0, 2)).merged is None
    last = finish_node(tmp_path, node1, Node(1, 2))
    assert last.merged is not None and last.waiting_for == []
    assert last.merged.verdict.job["ranks"] == 2
    verdict = json.loads((tmp_path / layout.VERDICT).read_text())
    assert verdict["job"]["ranks"] == 2
    assert (tmp_path / layout.REPORT).read_text().startswith("<!DOCTYPE html>")
    merged = json.loads((tmp_path / layout.NODES_RECORD).read_text())
    assert (merged["nodes"], merged["merged_by"]) == (["node-0", "node-1"], 1)
    assert finish_node(tmp_path, node0, Node(0, 2)).merged is None  # claimed already


def test_a_job_directory_and_the_newest_run(tmp_path: Path) -> None:
    root = tmp_path / "doctor-runs"
    single = root / "a-single"
    single.mkdir(parents=True)
    write_record(single)
    job = root / "b-nodes"
    assert not is_job_dir(job)
    fake_node(job, 0)
    assert is_job_dir(job) and not is_job_dir(single) and not is_job_dir(job / "node-0")
    time.sleep(0.01)  # distinct mtimes for "newest", not a timing assertion
    fake_node(job, 1)
    assert newest_run(root) == job
    time.sleep(0.01)
    write_record(single)
    assert newest_run(root) == single


# ----- the doors on a job directory --------------------------------------------------------


