"""Collectives as a trace or a frame would give them, shared by the tests of parallelism kinds
(tests/unit/test_parallelism.py) and of a sharded job's phases (tests/unit/test_shard_phases.py):
an FSDP2-over-gloo step's events, and per-rank collective frames with their roles."""

from __future__ import annotations

from typing import Any

import pandas as pd

from doctor.analyse.comms import RankComms, classify, waiting_times
from doctor.analyse.parallelism import roles

MAIN, GLOO = 1, 9


def ev(cat: str, name: str, ts: float, dur: float, tid: int = MAIN, **args: Any
       ) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid,
            "args": args}


def gather(ts: float, unit: str, floats: int = 1000, dur: float = 400) -> list[dict[str, Any]]:
    """FSDP2 gathering a unit: its annotation, c10d's call (output, input), gloo's work."""
    return [
        ev("user_annotation", f"FSDP::all_gather ({unit})", ts, dur + 20),
        ev("cpu_op", "c10d::_allgather_base_", ts + 5, 5,
           **{"Input Dims": [[2 * floats], [floats]], "Input type": ["float", "float"]}),
        ev("user_annotation", "gloo:all_gather", ts + 12, dur, GLOO,
           **{"Input Dims": [[floats]], "Input type": ["float"]}),
    ]


def fsdp_step() -> list[dict[str, Any]]:
    """One FSDP2 step of one unit over 2 ranks: gathered in forward (400 us), computed (100 us),
    gathered again in backward inside the autograd node, its gradient reduce-scattered (gloo
    all-reduces it) at the end of backward, then the optimizer."""
    return [
        ev("user_annotation", "ProfilerStep#1", 0, 2000),
        ev("user_annotation", "FSDP::pre_forward (0)", 0, 450),
        *gather(10, "0"),
        ev("cpu_op", "aten::addmm", 500, 100),
        ev("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 700, 700),
        ev("user_annotation", "FSDP::pre_backward (0)", 705, 440),
        *gather(710, "0"),
        ev("cpu_op", "aten::mm", 1200, 150),
        ev("user_annotation", "FSDP::root_post_backward_callback", 1420, 400),
        ev("user_annotation", "FSDP::post_backward_reduce (0)", 1425, 390),
        ev("cpu_op", "c10d::_reduce_scatter_base_", 1430, 5,
           **{"Input Dims": [[1000], [2000]], "Input type": ["float", "float"]}),
        ev("user_annotation", "gloo:all_reduce", 1440, 360, GLOO,
           **{"Input Dims": [[2000]], "Input type": ["float"]}),
        ev("user_annotation", "Optimizer.step#SGD.step", 1850, 100),
    ]


def calls(rows: list[tuple[str, str, float, float]], ranks: int = 2, **extra: Any
          ) -> pd.DataFrame:
    """(kind, phase, bytes, seconds) rows, the same on each rank, one after the other."""
    out = []
    for rank in range(ranks):
        for i, (kind, phase, nbytes, seconds) in enumerate(rows):
            out.append({"rank": rank, "kind": kind, "phase": phase, "bytes": nbytes,
                        "seconds": seconds, "exposed_s": seconds, "start_us": i * 1e4,
                        "end_us": i * 1e4 + seconds * 1e6, "group": 2,
                        "bus_bytes_s": nbytes / seconds, "owner": "", "unit": "", **extra})
    frame = pd.DataFrame(out)
    frame = classify(frame, waiting_times(frame))
    frame["role"] = roles(frame)
    return frame


def rank_comms(frame: pd.DataFrame, steps_: int = 1) -> dict[int, RankComms]:
    return {r: RankComms(r, frame[frame["rank"] == r].reset_index(drop=True), 0.1, steps=steps_)
            for r in sorted(set(frame["rank"]))}
