"""The scaling of each kind of parallelism (doctor.analyse.kind_scaling): a sharded job's
gathers and scatters, a pipeline's stages, DDP's only for DDP's all-reduces."""

from __future__ import annotations

import pandas as pd
import pytest

from doctor.analyse.bubble import Bubble, StageTime
from doctor.analyse.comm_model import LinkFit
from doctor.analyse.comms import RankComms
from doctor.analyse.kind_scaling import (
    job_scaling,
    pipeline_scaling,
    sharded_comm,
    sharded_scaling,
)
from doctor.analyse.ops import RankOps
from doctor.analyse.parallelism import Parallelism
from doctor.rules import communication
from doctor.rules.base import run_rules
from tests.support import comm_model, evidence

ALPHA, BETA = 1e-3, 1e9  # the link the sharded calls below ran over: 1 ms, 1 GB/s


def sharded_rank(steps: int = 4, exposed_part: float = 0.5, role: str = "sharded"
                 ) -> RankComms:
    """A rank of 2 whose step all-gathers three units (1, 4 and 16 MB) and reduce-scatters
    them, each call taking exactly alpha + (n-1)/n b / beta; ``exposed_part`` of it exposed."""
    rows = []
    for _ in range(steps):
        for kind in ("allgather", "reducescatter"):
            for mb in (1, 4, 16):
                b = mb * 2**20
                t = ALPHA + 0.5 * b / BETA
                rows.append({"kind": kind, "bytes": float(b), "seconds": t,
                             "exposed_s": t * exposed_part, "role": role, "bound": "bandwidth",
                             "bus_bytes_s": 0.5 * b / t, "rank": 0})
    calls = pd.DataFrame(rows)
    comm = float(calls["seconds"].sum()) / steps
    return RankComms(0, calls, window_s=steps * 4 * comm, steps=steps)  # comm: 1/4 of the step


def test_sharded_link_fit_and_scaling_follow_the_formulas() -> None:
    m = sharded_comm(sharded_rank(), 2)
    assert m is not None
    assert m.link.alpha_s == pytest.approx(ALPHA, rel=1e-6)
    assert m.link.beta_bytes_s == pytest.approx(BETA, rel=1e-6)
    points = sharded_scaling(m, (4, 8))
    assert [p.ranks for p in points] == [2, 4, 8]
    assert points[0].step_s == pytest.approx(m.step_s)
    total = 2 * (1 + 4 + 16) * 2**20  # a step's bytes, gathered and scattered
    for p in points[1:]:
        n = p.ranks
        # 6 calls, each alpha per hop (n-1 of them, 1 at 2 ranks); (n-1)/n of the bytes
        comm = 6 * ALPHA * (n - 1) + (n - 1) / n * total / BETA
        hidden = 0.5 * m.comm_s
        exposed = max(0.5 * comm, comm - hidden * 2 / n)
        assert p.exposed_s == pytest.approx(exposed, rel=1e-6)
        assert p.step_s == pytest.approx((m.step_s - m.exposed_s) * 2 / n + exposed, rel=1e-6)
    assert points[2].exposed_share > points[1].exposed_share > points[0].exposed_share


def test_tensor_parallel_scaling_keeps_dtensors_host_work_whole() -> None:
    """A tensor parallel job's collectives move the same bytes at any degree, as a sharded
    job's do; the compute divides, DTensor's host work (its dispatch beside each op) does not."""
    rank = sharded_rank(role="tensor")
    ops = RankOps(0, pd.DataFrame({"op": ["PythonSubclass", "aten::mm"],
                                   "self_s": [0.004 * rank.steps, 0.01 * rank.steps]}),
                  None, None, None, rank.window_s)
    par = Parallelism(2, False, "", 0, None, 0.0, 0.0, tensor_calls=6.0, tensor_size=2)
    scale = job_scaling(par, {0: rank}, None, None, None, None, {0: ops})
    assert scale is not None and scale.kind == "tensor"
    m = sharded_comm(rank, 2, "tensor")
    assert m is not None
    at_4 = scale.points[1]
    assert at_4.ranks == 4
    # the exposed part as the sharded model gives it; the compute less 4 ms halves
    plain = sharded_scaling(m, (4,))[1]
    assert at_4.exposed_s == pytest.approx(plain.exposed_s)
    assert at_4.step_s == pytest.approx((m.step_s - m.exposed_s - 0.004) / 2 + 0.004
                                        + plain.exposed_s)
    assert at_4.step_s == pytest.approx(plain.step_s + 0.002)


def test_sharded_scaling_takes_the_link_between_nodes_past_one_node() -> None:
    m = sharded_comm(sharded_rank(), 2)
    assert m is not None
    slow = LinkFit(0.0, BETA / 10, 0, "stated")
    same, across = (sharded_scaling(m, (4, 16), link=slow, ranks_per_node=k) for k in (16, 8))
    assert [p.across_nodes for p in across] == [False, False, True]
    assert across[1] == same[1]  # 4 ranks fit on a node either way
    # a tenth the bandwidth, the same latency per hop; compute hides 1/8 of what it hid here
    comm = 6 * ALPHA * 15 + 15 / 16 * 2 * 21 * 2**20 / (BETA / 10)
    assert across[2].exposed_s == pytest.approx(max(0.5 * comm, comm - 0.5 * m.comm_s / 8))
    assert across[2].exposed_s > 3 * same[2].exposed_s


def test_pipeline_scaling_grows_the_bubble_at_the_same_microbatches() -> None:
    # pacing stage (rank 1): outside 0.4-0.3-0.05-0.02 = 0.03; fill-drain over 4 micro-batches
    # (0.5 + 3*0.3)/4 = 0.35; per-micro-batch overhead 0.4-0.03-0.35 = 0.02
    b = Bubble("ScheduleGPipe", 2, 4, 1, (StageTime(0, "0", 0.4, 0.2, 0.15, 0.02),
                                          StageTime(1, "1", 0.4, 0.3, 0.05, 0.02)))
    points = pipeline_scaling(b, (8,))
    assert [p.ranks for p in points] == [2, 8]
    assert points[0].step_s == pytest.approx(0.4)
    # 8 stages: 0.03/4 + (0.5 + 3*0.3/4)/4 + 0.02; not computing: that less 0.03/4 and 0.5/8
    assert points[1].step_s == pytest.approx(0.20875)
    assert points[1].exposed_s == pytest.approx(0.20875 - 0.0075 - 0.0625)
    assert points[1].exposed_share > points[0].exposed_share
    # past one node the transfers take 3x as long: the pacing stage's 0.02 twice more
    across = pipeline_scaling(b, (8,), slower_link=3.0, ranks_per_node=4)
    assert across[1].across_nodes and across[1].step_s == pytest.approx(0.20875 + 0.04)


def par(**kinds: object) -> Parallelism:
    base = {"world": 2, "ddp": False, "sharded": "", "units": 0, "reshard_after_forward": None,
            "stats_calls": 0.0, "pipeline_calls": 0.0}
    return Parallelism(**{**base, **kinds})  # type: ignore[arg-type]


def test_each_kind_gets_its_own_model_and_never_ddps_for_other_collectives() -> None:
    b = Bubble("", 2, 2, 1, (StageTime(0, "", 0.4, 0.2, 0.1, 0.01),
                             StageTime(1, "", 0.4, 0.25, 0.05, 0.01)))
    ddp = {0: comm_model()}
    sharded = job_scaling(par(sharded="FSDP2"), {0: sharded_rank()}, None, None, None, 8)
    assert sharded is not None and sharded.kind == "sharded"
    assert "(N'-1)/N'" in sharded.note
    pipe = job_scaling(par(pipeline_calls=4.0), None, None, b, None, 8)
    assert pipe is not None and pipe.kind == "pipeline" and "bubble grows" in pipe.note
    assert job_scaling(par(ddp=True), None, ddp, None, None, 8).kind == "ddp"  # type: ignore
    # a sharded job whose gathers cannot be fitted, a pipeline without its bubble: nothing,
    # not DDP's all-reduce model
    assert job_scaling(par(sharded="FSDP"), {0: sharded_rank(role="other")}, ddp, None,
                       None, 8) is None
    assert job_scaling(par(pipeline_calls=4.0), None, ddp, None, None, 8) is None


def test_the_scaling_finding_says_a_sharded_jobs_kind_without_ddp_fixes() -> None:
    scale = job_scaling(par(sharded="FSDP2"), {0: sharded_rank(exposed_part=0.9)}, None, None,
                        None, 8)
    (f,) = run_rules(evidence(scaling=scale), [communication.scaling_outlook]).findings
    assert f.evidence["kind"] == "sharded" and f.evidence["ranks"] == 8
    assert f.fixes == ()
    assert f.evidence["exposed_share"] > f.evidence["exposed_share_now"]
