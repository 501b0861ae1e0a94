"""Kinds of parallelism told apart by their collectives (doctor.analyse.parallelism) and each
given its own fixes (doctor.rules.communication, doctor.rules.comm_kinds): traces built to look
like FSDP2 over gloo, a synchronised BatchNorm, DDP and a pipeline. Proportions and names only."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

from doctor.analyse.comms import comms_parallelism
from doctor.analyse.memory import RankMemory
from doctor.analyse.parallelism import GRADIENTS, PIPELINE, SHARDED, STATS, TENSOR, ZERO, roles
from doctor.analyse.tensor_parallel import dtensor_host_s
from doctor.rules import communication, run_rules
from doctor.rules.comm_kinds import exposed_by_role
from doctor.rules.tensor_fixes import tensor_fixes
from doctor.trace.comm_calls import collective_calls
from doctor.trace.events import build_timeline
from doctor.trace.steps import step_frame_from_timeline
from doctor.verdict import Finding
from tests.collective_frames import GLOO, calls, ev, fsdp_step, rank_comms
from tests.support import evidence, steps


def test_fsdp_collectives_are_named_by_the_call_that_issued_them() -> None:
    t = build_timeline(fsdp_step())
    calls = collective_calls(t)
    got = calls[["kind", "phase", "owner", "unit"]].values.tolist()
    assert got == [["allgather", "forward", "FSDP2", "0"], ["allgather", "backward", "FSDP2", "0"],
                   ["reducescatter", "backward", "FSDP2", "0"]]  # gloo all-reduced it
    assert calls["bytes"].tolist() == [8000, 8000, 8000]  # the gathered output, the whole input
    # the autograd node around the backward gather waits for it: nothing hides it
    assert calls["exposed_s"].sum() == pytest.approx(calls["seconds"].sum())
    [row] = step_frame_from_timeline(t, 0).to_dict(orient="records")
    # FSDP's hooks and the gathers are communication; the two matrix products compute, and the
    # autograd node's own time outside the hook (105 us)
    assert row["excl_compute_s"] == pytest.approx(355e-6, abs=10e-6)
    assert row["excl_communication_s"] == pytest.approx((450 + 440 + 400) * 1e-6)  # the hooks


#: A synchronised BatchNorm of 4 layers: a 2 KB gather each in forward, the gradient of the
#: gathered 4 KB all-reduced in backward, and DDP's one 8 MB bucket.
SYNC_BN = [*[("allgather", "forward", 2048, 1e-3)] * 4, ("allreduce", "backward", 8e6, 4e-3),
           *[("allreduce", "backward", 4096, 1e-3)] * 4]


def test_the_sync_batchnorm_pattern_is_told_from_ddp_buckets() -> None:
    c = calls(SYNC_BN)
    assert c[c["rank"] == 0]["role"].tolist() == [STATS] * 4 + [GRADIENTS] + [STATS] * 4
    # tiny DDP buckets in backward with no statistics gathered in forward stay DDP's
    tiny = calls([("allreduce", "backward", 4096, 1e-3)] * 6)
    assert set(tiny["role"]) == {GRADIENTS}
    assert set(calls([("sendrecv", "forward", 1e6, 1e-3)] * 2)["role"]) == {PIPELINE}
    # all-gathers of parameters, whoever issued them, are a sharded job's
    assert set(calls([("allgather", "forward", 4e6, 1e-3),
                      ("reducescatter", "backward", 4e6, 1e-3)])["role"]) == {SHARDED}


def test_the_job_section_names_the_parallelism() -> None:
    rows = [("allgather", "forward", 4e6, 1e-3), ("allgather", "backward", 4e6, 1e-3),
            ("reducescatter", "backward", 4e6, 1e-3)]
    fsdp = pd.concat([calls(rows, owner="FSDP2", unit=u) for u in ("0", "1", "2")])
    par = comms_parallelism(rank_comms(fsdp), 2, ddp_seen=False)
    assert par.describe() == "FSDP2 over 2 ranks, reshard after forward; 3 units"
    assert par.kinds == ("sharded",)
    no_reshard = fsdp[~((fsdp["kind"] == "allgather") & (fsdp["phase"] == "backward"))]
    assert comms_parallelism(rank_comms(no_reshard), 2, False).describe() == \
        "FSDP2 over 2 ranks, no reshard after forward; 3 units"
    bn = comms_parallelism(rank_comms(calls(SYNC_BN)), 2, ddp_seen=True)
    assert bn.kinds == ("ddp", "stats")
    assert "8 small collectives a step" in bn.describe()


def comm_finding(frame: pd.DataFrame, **facts: Any) -> Finding:
    window = steps(device="cpu", gpu_busy_s=0.0, comm_s=0.08, comm_exposed_s=0.08)
    [f] = run_rules(evidence(window=window, comms=rank_comms(frame), cores=8, ranks_here=2,
                             **facts), [communication.exposed_communication]).findings
    return f


def codes(f: Finding) -> str:
    return "\n".join(fx.code + fx.title for fx in f.fixes)


def test_a_sharded_job_gets_fsdp_fixes_never_ddp_buckets() -> None:
    rows = [("allgather", "forward", 4e6, 10e-3), ("allgather", "backward", 4e6, 10e-3),
            ("reducescatter", "backward", 4e6, 10e-3)]
    f = comm_finding(pd.concat([calls(rows, owner="FSDP2", unit=u) for u in ("0", "1")]))
    text = codes(f)
    assert "bucket_cap" not in text and "no_sync" not in text and "compress_hook" not in text
    assert "reshard_after_forward=False" in text and "set_modules_to_forward_prefetch" in text
    assert f.evidence["exposed_by_role"] == {SHARDED: 1.0}
    reshard = next(x for x in f.fixes if "reshard_after_forward" in x.title)
    # the backward gathers are a third of the exposed collectives
    assert reshard.estimated_speedup == pytest.approx(1 / (1 - 0.8 / 3), rel=0.01)
    assert "MiB more a rank" in reshard.why
    # a setting of every fully_shard call, as the estimate assumes: doctor try measures it
    assert reshard.apply == {"fsdp": {"reshard_after_forward": False}}


def test_synchronised_statistics_get_their_fixes_and_ddp_keeps_its_own() -> None:
    f = comm_finding(calls(SYNC_BN))
    titles = [x.title for x in f.fixes]
    assert "Use plain BatchNorm where each rank's batch is large enough" in titles
    assert f.evidence["exposed_by_role"][STATS] == pytest.approx(8 / 12)
    plain = next(x for x in f.fixes if "plain BatchNorm" in x.title)
    assert plain.estimated_speedup == pytest.approx(1 / (1 - 0.8 * 8 / 12), rel=0.01)
    assert any("bucket_cap" in x.code for x in f.fixes)  # DDP's bucket is a third of it
    only_stats = calls([r for r in SYNC_BN if r[2] < 1e6])
    assert "bucket_cap" not in codes(comm_finding(only_stats))


def test_a_pipeline_gets_its_bubble_against_theory_not_ddp_fixes() -> None:
    frame = calls([("sendrecv", "forward", 1e6, 5e-3)] * 4)  # 2 micro-batches on 2 stages
    # the second stage hardly waits: its calls take the transfer alone
    frame.loc[frame["rank"] == 1, ["seconds", "exposed_s"]] = 1e-3
    ledger = pd.DataFrame([{"rank": r, "step": i, "wall_s": 0.1, "compute": c,
                            "communication": w} for i in range(4)
                           for r, c, w in ((0, 0.04, 0.055), (1, 0.07, 0.02))])
    f = comm_finding(frame, ledger=ledger)
    assert "bucket_cap" not in codes(f) and "n_microbatches=4" in codes(f)
    more = next(x for x in f.fixes if "micro-batches (2 -> 4)" in x.title)
    assert "2 stages and 2 micro-batches idles 33%" in more.why  # (p-1)/(m+p-1)
    bubble = f.evidence["pipeline_bubble"]
    assert bubble["theory"] == pytest.approx(1 / 3)
    assert bubble["by_rank"]["0"] == pytest.approx(0.055 * 16 / 20 / 0.1)  # less transfers
    assert bubble["by_rank"]["1"] == 0.0
    # the stage that computes most paces the others: named, with its excess
    balance = next(x for x in f.fixes if x.title.startswith("Balance the stages"))
    assert "rank 1's stage is the slowest (1.3x" in balance.title
    # (sum(c) + (m-1) max(c)) / m with max(c) at the mean: 0.09 -> 0.0825 of a 0.1 s step
    assert balance.estimated_speedup == pytest.approx(0.1 / (0.1 - 0.09 + 0.0825))


def test_ddp_all_reduces_keep_ddps_fixes() -> None:
    f = comm_finding(calls([("allreduce", "backward", 8e6, 8e-3)] * 3))
    assert "bucket_cap_mb" in codes(f) and "no_sync" in codes(f)


def test_a_thread_blocked_on_its_collective_inside_an_op_is_communicating() -> None:
    # a custom autograd Function gathers statistics synchronously: the op around the call
    # holds the thread's wait for gloo, not compute
    events = [
        ev("user_annotation", "ProfilerStep#1", 0, 1000),
        ev("cpu_op", "GatherStats", 0, 800),
        ev("cpu_op", "aten::empty_like", 10, 5),
        ev("cpu_op", "c10d::allgather_", 20, 10),
        ev("user_annotation", "gloo:all_gather", 40, 730, GLOO,
           **{"Input Dims": [[512]], "Input type": ["float"]}),
        ev("cpu_op", "aten::stack", 780, 15),
    ]
    t = build_timeline(events)
    [row] = step_frame_from_timeline(t, 0).to_dict(orient="records")
    assert row["excl_communication_s"] == pytest.approx(750e-6, abs=15e-6)
    assert row["excl_compute_s"] == pytest.approx(50e-6, abs=15e-6)
    [call] = collective_calls(t).to_dict(orient="records")
    assert call["exposed_s"] == pytest.approx(call["seconds"])
    assert call["phase"] == "forward" and call["owner"] == ""


def test_an_embedding_all_to_all_is_not_given_ddp_fixes() -> None:
    f = comm_finding(calls([("alltoall", "forward", 1e6, 5e-3)] * 3 +
                           [("allreduce", "backward", 8e6, 1e-3)]))
    assert f.evidence["exposed_by_role"]["other"] == pytest.approx(15 / 16)
    assert "bucket_cap" not in codes(f) and "TrainPipelineSparseDist" in codes(f)


def test_a_backend_work_without_the_call_that_enqueued_it_is_still_a_collective() -> None:
    events = [ev("user_annotation", "gloo:all_reduce", 10, 100, GLOO,
                 **{"Input Dims": [[250]], "Input type": ["float"]})]
    [row] = collective_calls(build_timeline(events)).to_dict(orient="records")
    assert row["kind"] == "allreduce" and row["bytes"] == 1000 and row["phase"] == "forward"


def test_a_send_in_flight_beside_the_next_micro_batch_is_not_exposed() -> None:
    # gloo records a send on the thread that posted it, from the call to its completion,
    # while that thread computes the next micro-batch; the receive after it blocks the thread
    events = [
        ev("user_annotation", "ProfilerStep#1", 0, 2000),
        ev("cpu_op", "aten::addmm", 0, 300),
        ev("cpu_op", "c10d::send", 310, 10, **{"Input Dims": [[250]], "Input type": ["float"]}),
        ev("user_annotation", "gloo:send", 320, 600,
           **{"Input Dims": [[250]], "Input type": ["float"]}),
        ev("cpu_op", "aten::addmm", 330, 300),  # the next micro-batch, beside the send
        ev("cpu_op", "aten::addmm", 700, 200),  # Python between ops: not a wait
        ev("cpu_op", "c10d::recv_", 1000, 10, **{"Input Dims": [[250]], "Input type": ["float"]}),
        ev("user_annotation", "gloo:recv", 1010, 800,
           **{"Input Dims": [[250]], "Input type": ["float"]}),
        ev("cpu_op", "aten::mm", 1820, 150),
    ]
    t = build_timeline(events)
    send, recv = collective_calls(t).to_dict(orient="records")
    assert send["kind"] == recv["kind"] == "sendrecv"
    assert send["exposed_s"] < 0.25 * send["seconds"]  # the gap that ends as it completes
    assert recv["exposed_s"] == pytest.approx(recv["seconds"], rel=0.02)
    [row] = step_frame_from_timeline(t, 0).to_dict(orient="records")
    assert row["excl_compute_s"] == pytest.approx(950e-6, abs=30e-6)


def test_a_sharded_optimizers_broadcasts_get_their_role_and_fixes() -> None:
    # ZeRO-1: every parameter broadcast after the optimizer's step (one the window cut short
    # shows in forward), beside DDP's one bucket
    rows = [("allreduce", "backward", 8e6, 1e-3), *[("broadcast", "optimizer", 4096, 2e-3)] * 10,
            ("broadcast", "forward", 4096, 2e-3), ("broadcast", "forward", 999, 2e-3)]
    frame = calls(rows)
    mine = frame[frame["rank"] == 0]["role"].tolist()
    assert mine == [GRADIENTS] + [ZERO] * 11 + ["other"]
    par = comms_parallelism(rank_comms(frame), 2, ddp_seen=True)
    assert par.kinds == ("ddp", "zero")
    assert par.describe() == "DDP over 2 ranks; ZeRO-1 sharded optimizer over 2 ranks; " \
                             "11 parameter broadcasts a step"
    f = comm_finding(frame)
    text = codes(f)
    assert "parameters_as_bucket_view=True" in text and "overlap_with_ddp=True" in text
    assert "bucket_cap" not in text  # DDP's all-reduce is under a tenth of the exposed time
    assert "sharded optimizer (ZeRO-1)" in f.title


def test_a_sharded_optimizers_bucket_is_estimated_from_its_broadcasts_latency() -> None:
    # 20 broadcasts a step: 10 weights of 1 MB at 1 GB/s over a 1 ms latency, 10 biases of
    # 1 KB (1 ms); one bucket a rank: 2 calls of the same 10 MB, 2 ms + 10 ms
    rows = [("allreduce", "backward", 8e6, 1e-4)]
    for _ in range(10):
        rows += [("broadcast", "optimizer", 1e6, 2e-3), ("broadcast", "optimizer", 1e3, 1e-3)]
    f = comm_finding(calls(rows))
    bucket = next(x for x in f.fixes if "parameters_as_bucket_view" in x.title)
    kept = (2 * 1e-3 + 10.01e6 / 1e9) / 30e-3  # of the broadcasts' 30 ms
    zero_share = 30e-3 / 30.1e-3  # of the exposed communication; communication: 0.8 of the step
    assert bucket.estimated_speedup == pytest.approx(1 / (1 - 0.8 * zero_share * (1 - kept)),
                                                     rel=0.02)
    assert "1.00 ms a call" in bucket.why
    # every broadcast one size: no latency apart from bandwidth, no estimate
    same = [("allreduce", "backward", 8e6, 1e-4), *[("broadcast", "optimizer", 4096, 2e-3)] * 10]
    alone = next(x for x in comm_finding(calls(same)).fixes
                 if "parameters_as_bucket_view" in x.title)
    assert alone.estimated_speedup is None


#: Tensor parallel MLP blocks: a row-parallel layer's 32 KiB output all-reduced in forward (6),
#: a column-parallel layer's input gradient in backward (5: the first layer's input needs none).
TP = [("allreduce", "forward", 32768, 1e-3)] * 6 + [("allreduce", "backward", 32768, 1e-3)] * 5


def test_tensor_parallel_collectives_are_neither_statistics_nor_gradients() -> None:
    # unmarked, small all-reduces in forward and of the same sizes in backward are the
    # statistics' pattern (what doctor said of a tensor parallel job before it knew them)
    assert set(calls(TP)["role"]) == {STATS}
    tp = calls(TP, functional=True)  # issued by DTensor's functional collectives
    assert set(tp["role"]) == {TENSOR}
    par = comms_parallelism(rank_comms(tp), 2, ddp_seen=False)
    assert par.kinds == ("tensor",) and not par.ddp
    assert par.describe() == "tensor parallel over 2 ranks; 11 collectives of activations a step"
    # a compiled graph's gradient all-reduces are functional too, in backward alone: DDP's,
    # unless the job called parallelize_module
    compiled = calls([("allreduce", "backward", 8e6, 4e-3)] * 3, functional=True)
    assert set(compiled["role"]) == {GRADIENTS}
    assert set(roles(compiled, tensor_parallel=True)) == {TENSOR}
    # a compiled FSDP2's gathers and scatters: functional, in forward, no all-reduce
    fsdp = calls([("allgather", "forward", 4e6, 1e-3), ("reducescatter", "backward", 4e6, 1e-3)],
                 functional=True)
    assert set(fsdp["role"]) == {SHARDED}
    # where the probe saw FSDP and no parallelize_module, none is tensor parallel's
    assert TENSOR not in set(roles(calls(TP, functional=True), tensor_parallel=False))


def test_tensor_parallel_gets_its_own_fixes_never_ddp_or_batchnorm() -> None:
    f = comm_finding(calls(TP, functional=True))
    text = codes(f)
    for foreign in ("bucket_cap", "no_sync", "compress_hook", "BatchNorm", "GroupNorm",
                    "fully_shard"):
        assert foreign not in text
    assert f.evidence["exposed_by_role"] == {TENSOR: 1.0}
    assert any(x.title == "Parallelise whole blocks, not each layer" for x in f.fixes)
    # with no parameter bytes measured, DDP's all-reduce cannot be sized: no data parallel fix
    assert not any(x.title.startswith("Data parallel instead") for x in f.fixes)
    ex = exposed_by_role(rank_comms(calls(TP, functional=True)))
    assert ex is not None
    [data] = [x for x in tensor_fixes(ex, None, 0.8, 0.1, rank_memory(64 * 1024))
              if x.title.startswith("Data parallel instead")]
    # 80 % of a 0.1 s step exposed: each rank computes every layer whole on half the batch
    # (the same 20 %) and all-reduces the whole model's 128 KiB of gradients, 2 (g-1)/g of it,
    # at the 32.8 MB/s these collectives reached (4 % of the step)
    assert data.estimated_speedup == pytest.approx(1 / (0.2 + 131072 / 32768e3 / 0.1),
                                                   rel=0.01)
    # 10 MiB of parameters: their gradients' all-reduce alone outlasts the step
    assert not any(x.title.startswith("Data parallel")
                   for x in tensor_fixes(ex, None, 0.8, 0.1, rank_memory(10 * 2**20)))
    # a whole model that would not fit beside the rest of the peak: not offered either
    # (1 MiB of parameters a rank: 2 MiB whole; the rest of the peak beside them)
    full = rank_memory(2**20, peak=3.5 * 2**20, capacity=4 * 2**20)
    assert not any(x.title.startswith("Data parallel") for x in tensor_fixes(ex, None, 0.8, 0.1,
                                                                              full))
    fits = rank_memory(2**20, peak=2.25 * 2**20, capacity=4 * 2**20)
    [ok] = [x for x in tensor_fixes(ex, None, 0.8, 0.1, fits) if x.title.startswith("Data")]
    assert "take 2 MiB a rank instead of 1, 3 MiB at the peak of 4" in ok.why
    assert not any("asynchronous tensor parallel" in x.title for x in f.fixes)  # a CPU's gloo
    # where compute is most of the step, computing it whole on each rank would be slower
    window = steps(device="cpu", gpu_busy_s=0.0, comm_s=0.02, comm_exposed_s=0.02)
    [light] = run_rules(evidence(window=window, comms=rank_comms(calls(TP, functional=True)),
                                 cores=8, ranks_here=2),
                        [communication.exposed_communication]).findings
    assert not any(x.title.startswith("Data parallel instead") for x in light.fixes)


def test_dtensors_own_host_work_is_what_data_parallel_also_saves() -> None:
    ops = pd.DataFrame({"op": ["PythonSubclass", "aten::mm", "_c10d_functional::all_reduce",
                               "_c10d_functional::wait_tensor", "Redistribute"],
                        "self_s": [0.05, 0.04, 0.01, 0.08, 0.02]})
    # the dispatch, the issuing and the redistribution; not the model's matmul nor the wait
    assert dtensor_host_s(ops, 2) == pytest.approx(0.04)
    ex = exposed_by_role(rank_comms(calls(TP, functional=True)))
    assert ex is not None
    [plain, less] = [next(x for x in tensor_fixes(ex, None, 0.5, 0.1, rank_memory(64 * 1024),
                                                  None, d)
                          if x.title.startswith("Data parallel instead")) for d in (0.0, 0.02)]
    # half the step exposed, half compute of which a fifth of the step is DTensor's own
    reduce = 131072 / 32768e3 / 0.1
    assert plain.estimated_speedup == pytest.approx(1 / (0.5 + reduce), rel=0.01)
    assert less.estimated_speedup == pytest.approx(1 / (0.3 + reduce), rel=0.01)
    assert "less DTensor's own host work, 20%" in less.why
    # a fifth of the step in DTensor's own host work: compile it away (on a CPU, that fifth
    # of the step off)
    [compiled] = [x for x in tensor_fixes(ex, None, 0.5, 0.1, None, None, 0.02)
                  if x.title.startswith("Compile the tensor-parallel model")]
    assert "20% of the step" in compiled.title
    assert compiled.estimated_speedup == pytest.approx(1 / 0.8)
    # on a GPU the host's time costs the step only where the GPU waits: no estimate
    gpu = replace(ex, calls=ex.calls.assign(on_gpu=True))
    [on_gpu] = [x for x in tensor_fixes(gpu, None, 0.5, 0.1, None, None, 0.02)
                if x.title.startswith("Compile the tensor-parallel model")]
    assert on_gpu.estimated_speedup is None and "waits for it" in on_gpu.why
    assert "torch.compile(model)" in compiled.code and "20.0 ms" in compiled.why
    assert not any(x.title.startswith("Compile the tensor-parallel")  # 2 %: not worth it
                   for x in tensor_fixes(ex, None, 0.5, 0.1, None, None, 0.002))


def rank_memory(params: float, peak: float | None = None, capacity: float | None = None
                ) -> RankMemory:
    """A rank's memory with ``params`` of parameters (and nothing else static)."""
    return RankMemory(0, 0, "cpu", {"parameters": params}, peak_bytes=peak,
                      capacity_bytes=capacity)
