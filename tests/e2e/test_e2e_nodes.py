"""Two nodes of one DDP job (gloo, one rank each, both on this machine) under two concurrent
``doctor run --out SAME_DIR -- torchrun --nnodes 2 --node-rank K``: each node's own run
directory, and one merged verdict of the whole job written by the last to finish. Names and
counts only, never times. It costs about two of tests/test_e2e_distributed.py's runs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import SAMPLE_JOBS

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_nodes_write_their_own_folders_and_one_merged_verdict(tmp_path: Path) -> None:
    out, port = tmp_path / "job", free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "doctor.cli", "run", "--out", str(out), "--", "torchrun",
         "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "1",
         "--master-addr", "127.0.0.1", "--master-port", str(port),
         str(SAMPLE_JOBS / "ddp_allreduce_bound.py"), "--steps", "20"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in (0, 1)]
    try:
        results = [p.communicate(timeout=240) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(e[-3000:] for _, e in results)
    for k in (0, 1):
        node = out / f"node-{k}"
        assert (node / "run.json").is_file()
        assert [p.name for p in node.glob("rank-*")] == [f"rank-{k}"]
        assert (node / "verdict.json").is_file() and (node / "report.html").is_file()
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["job"]["ranks"] == 2
    assert verdict["bottleneck"] == "communication"
    # both nodes on this host: their link is the loopback doctor measured, not a network
    links = [c["link"] for c in verdict["communication"]]
    assert [link["name"] for link in links] == ["TCP loopback"] * 2
    assert all(c["by_kind"][0]["bus_gb_per_s"] > 0 for c in verdict["communication"])
    assert (out / "report.html").is_file()
    merged = [e for _, e in results if f"Report: {out / 'report.html'}" in e]
    assert len(merged) == 1  # one node wrote and printed the merged verdict
