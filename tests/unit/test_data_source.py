"""Where the job's data comes from: the mount table's kinds (doctor.probes.mounts), the parent's
scan of the job's descriptors on a recorded /proc (doctor.probes.open_files), the data source
over recorded scans (doctor.analyse.data_source), and the io finding's cause and first fix
(doctor.rules.input_remote, input_reads): a remote store gets more requests in flight, a network
filesystem a local copy, small files shards only where data files were read."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from doctor.analyse.data_source import data_source
from doctor.analyse.frames import WORKER_SCOPE, classify
from doctor.analyse.reads import read_pattern
from doctor.probes.mounts import (
    LOCAL,
    MEMORY,
    NETWORK,
    OBJECT_STORE,
    OVERLAY,
    mount_of,
    parse_mountinfo,
)
from doctor.probes.open_files import LOOPBACK, NOT_TCP, REMOTE, OpenFiles, tcp_table
from doctor.rules.input import input_loader, input_stage
from doctor.store.data_files import SCAN_COLUMNS, read_mounts, read_scans, save_data_files
from doctor.verdict import Fix
from tests.support import evidence, ledger, loaders, read_counters

MOUNTINFO = """\
22 1 254:0 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
23 22 0:50 / /data rw,relatime - nfs4 fileserver:/export/data rw,vers=4.2,rsize=1048576
24 22 0:51 / /mnt/s3 rw,nosuid,nodev - fuse.s3fs s3fs rw,user_id=0,group_id=0
25 22 0:52 / /mnt/gcs rw,nosuid,nodev - fuse gcsfuse rw,user_id=0
26 22 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683784k
27 22 254:1 / /scratch\\040disk rw,relatime shared:1 - ext4 /dev/nvme0n1 rw
28 22 0:53 / /lustre rw - lustre 10.0.0.1@tcp:/fs rw
"""


def test_the_mount_table_names_each_filesystems_kind() -> None:
    mounts = parse_mountinfo(MOUNTINFO + "malformed line\n")
    kinds = {m.mount_point: m.kind for m in mounts}
    assert kinds == {"/": OVERLAY, "/data": NETWORK, "/mnt/s3": OBJECT_STORE,
                     "/mnt/gcs": OBJECT_STORE, "/dev/shm": MEMORY, "/scratch disk": LOCAL,
                     "/lustre": NETWORK}
    where = {p: mounts[mount_of(p, mounts)].mount_point
             for p in ("/data/train/0001.jpg", "/datasets/x", "/scratch disk/a", "/dev/shm/b")}
    assert where == {"/data/train/0001.jpg": "/data", "/datasets/x": "/",
                     "/scratch disk/a": "/scratch disk", "/dev/shm/b": "/dev/shm"}


def fake_proc(root: Path, data: Path, written: Path) -> Path:
    """A /proc of one job process (pid 7): a data file open for reading, a log open for
    writing, an interpreter file, a pipe and three sockets; its mount table puts ``data`` on
    NFS; its TCP table has a listening socket, a connection it accepted, one fetch to this
    machine and one to another."""
    proc = root / "proc"
    fd, info, net = proc / "7" / "fd", proc / "7" / "fdinfo", proc / "7" / "net"
    for d in (fd, info, net, proc / "7" / "ns"):
        d.mkdir(parents=True)
    links = {"3": str(data), "4": str(written), "5": "/usr/lib/python3.11/os.py",
             "6": "pipe:[99]", "7": "socket:[1001]", "8": "socket:[1002]",
             "9": "socket:[1003]"}
    for n, target in links.items():
        os.symlink(target, fd / n)
        flags = "0100001" if n == "4" else "0100000"
        (info / n).write_text(f"pos:\t0\nflags:\t{flags}\nmnt_id:\t23\n")
    (proc / "7" / "mountinfo").write_text(
        f"22 1 254:0 / / rw - ext4 /dev/vda rw\n"
        f"23 22 0:50 / {data.parent} rw - nfs4 fileserver:/export rw\n")
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  " \
             "timeout inode\n"
    (net / "tcp").write_text(header + "\n".join([
        "0: 0100007F:1F90 00000000:0000 0A 0:0 00:0 0 0 0 1000 1 x",  # listening on 8080
        "1: 0100007F:1F90 0100007F:D431 01 0:0 00:0 0 0 0 1004 1 x",  # accepted: served
        "2: 0100007F:D431 0100007F:1F90 01 0:0 00:0 0 0 0 1001 1 x",  # a fetch to 127.0.0.1
        "3: 0A00000A:C350 2A01B80D:01BB 01 0:0 00:0 0 0 0 1002 1 x",  # a fetch elsewhere
    ]) + "\n")
    (net / "dev").write_text("Inter-|Receive\n face |bytes\n"
                             "    lo: 5000 10 0 0 0 0 0 0 5000 10 0 0 0 0 0 0\n"
                             "  eth0: 7000 10 0 0 0 0 0 0 300 10 0 0 0 0 0 0\n")
    os.symlink("net:[4026531992]", proc / "7" / "ns" / "net")
    return proc


def test_a_scan_finds_the_data_files_their_mount_and_the_fetches(tmp_path: Path) -> None:
    folder = tmp_path / "dataset"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.bin").write_bytes(b"x" * 1000)
    log = tmp_path / "log.txt"
    log.write_text("")
    proc = fake_proc(tmp_path, folder / "0.bin", log)
    files = OpenFiles(7, proc=proc, cpu_clock=lambda: 0.0)
    files.sample(1.0, [7])
    row = {c: files.scans[c][0] for c in SCAN_COLUMNS}
    assert row["files_open"] == 1 and row["files_new"] == 1  # not the log, not os.py
    assert row["sockets"] == 3
    assert (row["connections"], row["remote_connections"]) == (2, 1)  # 1003: not in the table
    assert (row["rx_lo_bytes"], row["rx_bytes"]) == (5000, 7000)
    [mount] = [m for m in files.mount_rows() if m["role"] == "data"]
    assert mount["kind"] == NETWORK and mount["fstype"] == "nfs4"
    assert (mount["files_seen"], mount["bytes_seen"]) == (1, 1000)
    assert (mount["dir_files"], mount["dir_bytes"]) == (3, 3000)  # the folder beside it
    files.sample(1.1, [7])  # not due yet: scans keep their pace
    assert len(files.scans["t_s"]) == 1
    save_data_files(tmp_path, files.scans, files.mount_rows())
    assert len(read_scans(tmp_path)) == 1
    assert set(read_mounts(tmp_path)["kind"]) >= {NETWORK}


def test_the_tcp_table_tells_fetches_from_a_served_end(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, tmp_path / "d" / "x", tmp_path / "w")
    assert tcp_table(proc, 7) == {1000: NOT_TCP, 1004: NOT_TCP, 1001: LOOPBACK, 1002: REMOTE}


def scans(seconds: float = 10.0, connections: float = 2.0, mb_per_s: float = 4.0,
          remote: bool = False, files_new: int = 0) -> pd.DataFrame:
    t = np.arange(0.0, seconds + 0.25, 0.5)
    rx = t * mb_per_s * 1e6
    return pd.DataFrame({
        "t_s": t, "files_open": 0.0, "files_new": float(files_new), "sockets": connections,
        "connections": connections, "remote_connections": connections if remote else 0.0,
        "rx_lo_bytes": 0.0 if remote else rx, "rx_bytes": rx if remote else 0.0,
        "netns_own": 0.0, "scan_cpu_s": 1e-4})


def test_the_data_source_gives_the_throughput_per_connection() -> None:
    source = data_source(scans(connections=2.0, mb_per_s=4.0, remote=True), None, (2.0, 8.0))
    assert source is not None
    assert source.received_mb_per_s == pytest.approx(4.0)
    assert source.mb_per_s_per_connection == pytest.approx(2.0)
    assert source.data is None
    assert data_source(None, None) is None


def remote_inputs(source_scans: pd.DataFrame | None, mounts: pd.DataFrame | None = None,
                  top: tuple[str, ...] = ("urlopen (urllib/request.py:216)",)) -> dict:  # type: ignore[type-arg]
    # two workers, each fetching a batch in 0.2 s of waiting; the step's own work is 0.02 s
    return {"ledger": ledger(wait=0.08, compute=0.02), "loaders": loaders(num_workers=2),
            "cores": 2, "split": {"io": 0.98, "preprocess": 0.02}, "top": {"io": top},
            "data_source": data_source(source_scans, mounts)}


def test_a_remote_store_gets_more_requests_in_flight_first() -> None:
    inputs = evidence(**remote_inputs(scans(connections=2.0, mb_per_s=4.0)))
    [io] = [f for f in input_stage(inputs) if f.id == "input.io"]
    assert io.evidence["cause"] == "remote store"
    assert "remote store" in io.title
    first, client = io.fixes[0], io.fixes[1]
    assert first.title.startswith("A remote store: 2.0 connections in flight at 2.00 MB/s each")
    workers = first.apply["dataloader"]["num_workers"]
    assert workers > 2  # more requests in flight than the two workers give
    assert first.estimated_speedup is not None and first.estimated_speedup > 2.0
    assert io.estimated_speedup is not None and io.estimated_speedup >= first.estimated_speedup
    assert "__getitems__" in client.code  # plain urllib: a thread pool over a batch
    # the loader finding asks for the same workers: they wait, they do not need cores
    [loader] = input_loader(inputs)
    assert loader.fixes[0].apply == {"dataloader": {"num_workers": workers,
                                                    "persistent_workers": True}}


@pytest.mark.parametrize(("top", "setting"), [
    ("BaseClient._make_api_call (botocore/client.py:960)", "max_pool_connections"),
    ("S3FileSystem._cat_file (s3fs/core.py:1100)", "batch_size"),
    ("Session.get (requests/sessions.py:600)", "pool_maxsize"),
])
def test_the_clients_own_parallelism_is_named(top: str, setting: str) -> None:
    inputs = evidence(**remote_inputs(scans(), top=(top,)))
    [io] = [f for f in input_stage(inputs) if f.id == "input.io"]
    assert io.evidence["cause"] == "remote store"
    assert setting in io.fixes[1].code


def test_a_network_filesystem_gets_a_local_copy_first() -> None:
    mounts = pd.DataFrame([
        {"mount_point": "/data", "fstype": "nfs4", "source": "srv:/x", "kind": NETWORK,
         "role": "data", "files_seen": 200.0, "bytes_seen": 2e8, "dir_files": 1000.0,
         "dir_bytes": 1e9, "free_bytes": 1e12, "total_bytes": 2e12},
        {"mount_point": "/dev/shm", "fstype": "tmpfs", "source": "tmpfs", "kind": MEMORY,
         "role": "staging", "files_seen": 0.0, "bytes_seen": 0.0, "dir_files": 0.0,
         "dir_bytes": 0.0, "free_bytes": 8e9, "total_bytes": 8e9}])
    inputs = evidence(**remote_inputs(scans(connections=0.0, files_new=4), mounts,
                                      top=("read_sample (train.py:40)",)))
    [io] = [f for f in input_stage(inputs) if f.id == "input.io"]
    assert io.evidence["cause"] == "network filesystem"
    assert io.evidence["data_fs_kind"] == NETWORK
    assert io.fixes[0].title.startswith("Cold reads from a network filesystem (nfs4 at /data")
    assert "/dev/shm has" in io.fixes[0].why and "954 MiB" in io.fixes[0].why


def test_a_socket_client_is_io_even_in_its_own_python() -> None:
    """Parsing an answer's JSON inside requests is the fetch's time (io), not decode."""
    stack = ("_worker_loop (torch/utils/data/_utils/worker.py:300)",
             "fetch (torch/utils/data/_utils/fetch.py:52)",
             "Remote.__getitem__ (train.py:20)",
             "Response.json (requests/models.py:970)",
             "loads (json/__init__.py:346)")
    assert classify(stack, WORKER_SCOPE) == ("io", "Response.json (requests/models.py:970)")
    decode = (*stack[:3], "loads (json/__init__.py:346)")
    assert classify(decode, WORKER_SCOPE)[0] == "decode"  # JSON of the job's own: decode


def test_small_reads_of_a_job_that_fetches_and_opens_no_file_are_not_small_files() -> None:
    """Pipe and socket reads count in the kernel's read counters too: 8 KiB reads, 600 a
    second, with connections and no data file seen open are not small files."""
    from doctor.rules.input_reads import SMALL_FILES, read_cause
    reads = read_pattern(read_counters(read_kib=8, reads_per_s=600, from_storage=0.0))
    assert read_cause(reads, files_read=True) == SMALL_FILES
    assert read_cause(reads, files_read=False) != SMALL_FILES
    inputs = evidence(**{**remote_inputs(scans(connections=2.0),
                                         top=("read_sample (train.py:40)",)),
                         "host": read_counters(read_kib=8, reads_per_s=600, from_storage=0.0)
                         .assign(cpu_pct=5.0)})
    [io] = [f for f in input_stage(inputs) if f.id == "input.io"]
    assert io.evidence["cause"] != SMALL_FILES
    assert "pack the small files" not in io.fixes[0].title


def test_small_files_say_the_files_seen_open_a_second_as_a_lower_bound() -> None:
    from doctor.rules.input_reads import io_fixes

    mounts = pd.DataFrame([
        {"mount_point": "/", "fstype": "ext4", "source": "/dev/vda", "kind": LOCAL,
         "role": "data", "files_seen": 40.0, "bytes_seen": 40 * 4096.0, "dir_files": 1024.0,
         "dir_bytes": 1024 * 4096.0, "free_bytes": 1e11, "total_bytes": 2e11}])
    source = data_source(scans(seconds=10.0, connections=0.0, files_new=2), mounts)
    assert source is not None and source.files_seen_per_s == pytest.approx(4.0)
    plain = (Fix("close", "", "copy"), Fix("more", "", "workers"), Fix("shards", "", "shards"))
    fixes = io_fixes(read_pattern(read_counters(4, 2000, 0.3)), plain, source)
    assert fixes[0].code == "shards"
    assert "4 distinct files were seen open a second, 4.0 KiB each" in fixes[0].why
    assert "lower bound" in fixes[0].why and "on local disk (ext4)" in fixes[0].why


def test_a_loop_that_fetches_itself_gets_workers_for_the_waits_not_for_the_cores() -> None:
    """num_workers=0 on a busy 2-core machine, the loading all waits: workers beyond the cores
    still help, so the loader finding asks for the requests in flight the io finding sizes."""
    inputs = evidence(**{**remote_inputs(scans(connections=1.0, mb_per_s=2.0)),
                         "loaders": loaders(num_workers=0)})
    [io] = [f for f in input_stage(inputs) if f.id == "input.io"]
    [loader] = input_loader(inputs)
    assert loader.fixes[0].title.startswith("num_workers=0, and the loading waits on reads")
    k = loader.fixes[0].apply["dataloader"]["num_workers"]
    assert k > 2 and io.fixes[0].apply["dataloader"]["num_workers"] == k
    assert "in the training process" in io.fixes[1].title


def test_the_clients_measured_cpu_bounds_the_gain_of_more_requests() -> None:
    """A client's Python counts as io but burns a core: where the workers' CPU was measured,
    more requests in flight gain less on the same cores."""
    def first_estimate(worker_cores: float | None) -> float:
        inputs = evidence(**remote_inputs(scans()), worker_cpu_cores=worker_cores)
        [io] = [f for f in input_stage(inputs) if f.id == "input.io"]
        assert io.fixes[0].estimated_speedup is not None
        return io.fixes[0].estimated_speedup

    idle, busy = first_estimate(None), first_estimate(0.5)  # half a core: 50 ms a 0.1 s step
    assert busy < idle
    assert busy == pytest.approx(0.1 / ((0.05 + 0.02) / 2), rel=0.05)  # (cpu + own) on 2 cores
