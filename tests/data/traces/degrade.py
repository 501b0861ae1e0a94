"""Write the damaged traces of tests/data/traces/degraded/ from the recorded ones beside this
file: ``python tests/data/traces/degrade.py``. Each is one way a trace arrives damaged or odd
(tests/data/traces/README.md says what the analysis makes of each)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "degraded"


def read(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(gzip.decompress((HERE / name).read_bytes()))
    return data


def write(name: str, text: str | bytes) -> None:
    raw = text.encode() if isinstance(text, str) else text
    (OUT / name).write_bytes(gzip.compress(raw, mtime=0))


def main() -> None:
    OUT.mkdir(exist_ok=True)
    raw = gzip.decompress((HERE / "input_bound.json.gz").read_bytes())
    # the job killed while torch.profiler wrote the trace: its JSON ends inside an event
    write("cut_mid_event.json.gz", raw[: int(len(raw) * 0.6)])
    # the copy stopped early: the gzip stream itself is cut
    recorded = (HERE / "input_bound.json.gz").read_bytes()
    (OUT / "cut_gzip_stream.json.gz").write_bytes(recorded[:4000])
    # a rank's trace of a DDP job without its distributedInfo (older torch, or another tool)
    rank1 = read("ddp_gloo_rank1.json.gz")
    del rank1["distributedInfo"]
    write("no_distributed_info.json.gz", json.dumps(rank1))
    # integers past 64 bits in the args (ids written by other tools): the same job, the same
    # verdict
    job = read("input_bound.json.gz")
    for i, ev in enumerate(e for e in job["traceEvents"] if e.get("cat") == "cpu_op"):
        if i % 50 == 0:
            ev.setdefault("args", {})["Comms Id"] = 2**70 + i
    write("large_integers.json.gz", json.dumps(job))
    # a profiler that recorded nothing
    write("no_events.json.gz", json.dumps({"schemaVersion": 1, "traceEvents": []}))


if __name__ == "__main__":
    main()
