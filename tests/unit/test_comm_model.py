"""The communication model (doctor.analyse.comm_model) on hand-made collectives and steps:
the fit, the overlap capacity, and the direction and size of each what-if on exaggerated
cases; and the rules that word it."""

from __future__ import annotations

import pytest

from doctor.analyse.comm_model import (
    LinkFit,
    bucket_what_ifs,
    compress_what_if,
    fit_link,
    no_sync_what_if,
    overlap_capacity,
    rank_comm,
    scaling,
)
from doctor.analyse.comms import TIE, CommModel, critical
from doctor.analyse.kind_scaling import ddp_scaling
from doctor.rules import communication, run_rules
from tests.support import comm_calls, comm_model, comm_window, ddp_buckets, evidence, steps

MB = 2**20


def test_the_fit_recovers_latency_and_bandwidth_from_calls_of_several_sizes() -> None:
    alpha, beta = 50e-6, 10e9
    sizes = [64 * 1024, 1 * MB, 8 * MB, 32 * MB]
    secs = [alpha + s / beta for s in sizes]  # 2 ranks: the bus carries the message once
    fit = fit_link(comm_calls(sizes, secs), world=2)
    assert fit is not None and fit.how == "fit"
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.beta_bytes_s == pytest.approx(beta, rel=1e-6)
    # one size only: bandwidth from the calls, no latency to separate
    same = fit_link(comm_calls([25 * MB] * 3, [0.05] * 3), world=2)
    assert same is not None and same.how == "bandwidth, latency unknown" and same.alpha_s == 0
    assert same.beta_bytes_s == pytest.approx(25 * MB / 0.05)
    # calls that waited for another rank say nothing of the link
    assert fit_link(comm_calls([25 * MB], [0.05], bound="waiting"), world=2) is None
    assert fit_link(comm_calls([25 * MB], [0.05]), world=1) is None


def test_one_big_bucket_exposed_more_buckets_overlap_backward_when_a_core_is_free() -> None:
    # 100 MB in one bucket, 80 ms of all-reduce all exposed, 100 ms of backward beside it
    m = rank_comm(0, 2, comm_window(0.3, 0.08, 0.08), comm_calls([100 * MB], [0.08]),
                  ddp_buckets(bucket_cap_bytes=128 * MB, backward_compute_s=0.1))
    assert m is not None and m.buckets == 1 and m.capacity_s == 0.0
    best = max(bucket_what_ifs(m), key=lambda w: w.speedup)
    assert best.speedup > 1.2  # 4 buckets of 32 MB: three of them hide behind backward
    assert best.setting == "bucket_cap_mb=32"
    # the same job with no core to spare for the communication threads: no gain predicted
    busy = rank_comm(0, 2, comm_window(0.3, 0.08, 0.08), comm_calls([100 * MB], [0.08]),
                     ddp_buckets(bucket_cap_bytes=128 * MB, backward_compute_s=0.1),
                     overlap_cores=0.0)
    assert busy is not None
    assert max(w.speedup for w in bucket_what_ifs(busy)) == pytest.approx(1.0)


def test_overlap_capacity_measured_and_scaled_with_buckets() -> None:
    # 4 buckets; 40 of 100 ms exposed, more than the last bucket: capacity is the overlap seen
    m = rank_comm(0, 2, comm_window(0.3, 0.1, 0.04), comm_calls([25 * MB] * 4, [0.025] * 4),
                  ddp_buckets(last_bucket_bytes=25 * MB))
    assert m is not None and m.capacity_s == pytest.approx(0.06)
    assert overlap_capacity(m, 2) == pytest.approx(0.06 * 0.5 / 0.75)
    assert overlap_capacity(m, 1) == 0.0
    # fewer, larger buckets lose overlap: predicted slower
    assert all(w.speedup < 1.0 for w in bucket_what_ifs(m) if "=100" in w.setting)


def test_no_sync_and_compression_cut_the_exposed_time_in_proportion() -> None:
    m = rank_comm(0, 2, comm_window(0.2, 0.1, 0.1), comm_calls([100 * MB], [0.1]), ddp_buckets())
    assert m is not None
    w = no_sync_what_if(m, every=4)
    assert w.step_s == pytest.approx(0.1 + 0.1 / 4)
    c = compress_what_if(m)
    assert c is not None and c.exposed_s == pytest.approx(0.05)  # half the bytes, no latency
    half = rank_comm(0, 2, comm_window(0.2, 0.1, 0.1), comm_calls([100 * MB], [0.1]),
                     ddp_buckets(dtypes="c10::BFloat16".lower()))
    assert half is not None and compress_what_if(half) is None  # already half precision


def test_scaling_exposed_share_grows_with_ranks_and_with_a_slower_link() -> None:
    m = rank_comm(0, 2, comm_window(0.2, 0.05, 0.02), comm_calls([50 * MB] * 2, [0.025] * 2),
                  ddp_buckets(last_bucket_bytes=50 * MB))
    assert m is not None
    points = scaling(m)
    assert points[0].ranks == 2 and points[0].step_s == pytest.approx(0.2)
    shares = [p.exposed_share for p in points]
    assert shares == sorted(shares) and shares[-1] > 0.5
    assert all(p.efficiency(points[0]) <= 1.0 + 1e-9 for p in points)
    slow = LinkFit(0.0, m.link.beta_bytes_s / 10, 0, "stated")
    across = scaling(m, link=slow, ranks_per_node=8)
    at16 = next(p for p in across if p.ranks == 16)
    assert at16.across_nodes and at16.exposed_share > next(
        p for p in points if p.ranks == 16).exposed_share


def test_the_exposed_finding_takes_its_fixes_and_estimates_from_the_model() -> None:
    frame = steps(comm_s=0.1, comm_exposed_s=0.1, dur_s=0.2)
    ev = evidence(window=frame, comm_models={0: comm_model()}, world_size=2)
    (f,) = [f for f in run_rules(ev, [communication.exposed_communication]).findings]
    estimates = [x.estimated_speedup for x in f.fixes]
    assert all(e is not None and e >= 1.02 for e in estimates)
    assert estimates == sorted(estimates, reverse=True)  # best first
    bucket = next(x for x in f.fixes if x.apply)
    cap = bucket.apply["ddp"]["bucket_cap_mb"]
    assert f"bucket_cap_mb={cap:g}" in bucket.code and cap < 128
    # a model that can size nothing (no exposed time left once waits are out): fixes as they are
    (h,) = run_rules(evidence(window=frame, comm_models={0: comm_model(exposed=0.0)}, world_size=2),
                     [communication.exposed_communication]).findings
    assert len(h.fixes) == 3 and all(x.estimated_speedup is None for x in h.fixes)
    # without a model, the fixes come without estimates
    (g,) = run_rules(evidence(window=frame, world_size=2),
                     [communication.exposed_communication]).findings
    assert all(x.estimated_speedup is None for x in g.fixes)


def test_the_scaling_finding_says_the_share_at_four_times_the_ranks() -> None:
    models = {0: comm_model()}
    ev = evidence(comm_models=models, scaling=ddp_scaling(models))
    (f,) = run_rules(ev, [communication.scaling_outlook]).findings
    assert f.severity == "info" and f.evidence["ranks"] == 8
    assert f.evidence["exposed_share"] > f.evidence["exposed_share_now"]
    assert f"{f.evidence['exposed_share']:.0%}" in f.title
    # little communication: nothing to say
    little = {0: comm_model(step=1.0, comm=0.01, exposed=0.001)}
    quiet = evidence(comm_models=little, scaling=ddp_scaling(little))
    assert run_rules(quiet, [communication.scaling_outlook]).findings == []


def test_the_critical_rank_is_the_one_with_most_exposed_communication() -> None:
    a, b, c = (comm_model(exposed=e) for e in (0.02, 0.09, 0.05))
    picked = critical({0: a, 1: b, 2: c})
    assert picked is not None and picked.model.exposed_s == pytest.approx(0.09)
    assert critical({}) is None


def test_the_link_nvlink_then_pcie_then_loopback_and_the_network_between_nodes() -> None:
    from doctor.analyse.comms import inter_node_link, network_link, node_link
    from doctor.store.rundata import RunRecord

    nvlink = RunRecord("run", ("x",), gpus=({"nvlinks": 18, "nvlink_version": 4,
                                          "pcie_gen_max": 5, "pcie_width_max": 16},))
    link = node_link(nvlink, on_gpu=True)
    assert link is not None and link.name == "NVLink 4 x18" and link.gb_per_s == 450
    pcie = RunRecord("run", ("x",), gpus=({"nvlinks": 0, "pcie_gen_max": 4,
                                        "pcie_width_max": 16},))
    link = node_link(pcie, on_gpu=True)
    assert link is not None and link.name == "PCIe 4 x16"
    assert link.gb_per_s == pytest.approx(31.5, rel=0.01)
    cpu = RunRecord("run", ("x",), links={"loopback_gb_per_s": 1.5, "nic": "eth0",
                                       "nic_gb_per_s": 1.25})
    link = node_link(cpu, on_gpu=False)
    assert link is not None and link.name == "TCP loopback" and link.source == "measured"
    net = network_link(cpu)
    assert net is not None and net.across_nodes and net.gb_per_s == 1.25
    stated = RunRecord("run", ("x",), links={"stated_gb_per_s": 25.0, "nic_gb_per_s": 1.25})
    fit = inter_node_link(stated)
    assert fit is not None and fit.beta_bytes_s == 25e9  # what the user states comes first
    assert node_link(RunRecord("run", ("x",)), on_gpu=False) is None
    assert inter_node_link(RunRecord("run", ("x",))) is None


def test_sizes_whose_times_no_line_explains_give_the_best_bandwidth_and_the_small_ones_latency(
        ) -> None:
    # a big bucket at 100 GB/s; a mid one slowed by traffic beside it; small ones at ~60 us
    sizes = [180 * MB, 18 * MB, 1 * MB, 180 * MB, 18 * MB, 1 * MB]
    secs = [1.8e-3, 4.5e-3, 60e-6 + MB / 1e11, 1.9e-3, 2.0e-3, 70e-6 + MB / 1e11]
    fit = fit_link(comm_calls(sizes, secs), world=2)
    assert fit is not None and fit.how == "bandwidth"
    assert fit.beta_bytes_s == pytest.approx(180 * MB / 1.8e-3)
    assert 40e-6 < fit.alpha_s < 80e-6


def test_the_summary_line_names_the_critical_rank_its_link_and_the_share_at_scale() -> None:
    from dataclasses import replace

    from doctor.analyse.analysis import Sections
    from doctor.analyse.comms import Link
    from doctor.reports.resource_lines import comm_lines

    link = Link("TCP loopback", 1.5, "measured")
    ranks = {rank: replace(m, model=replace(m.model, rank=rank), link=link)
             for rank, m in enumerate(comm_model(exposed=e) for e in (0.02, 0.1))}
    (line,) = comm_lines(Sections(models=ranks))
    assert line.startswith("Communication, rank 1: 100.0 MiB all-reduced a step in 1 bucket(s)")
    assert "of TCP loopback's 1.5 GB/s" in line and "at 8 ranks" in line
    assert comm_lines(Sections()) == []


def test_all_reduces_of_unknown_size_take_ddps_mean_bucket() -> None:
    from doctor.analyse.comms import sized_by_ddp

    frame = comm_calls([float("nan")] * 4, [0.01] * 4)
    sized = sized_by_ddp(frame, ddp_buckets(buckets=4, bucket_bytes=100 * MB))
    assert sized["bytes"].tolist() == [25 * MB] * 4
    assert sized_by_ddp(frame, ddp_buckets().iloc[0:0])["bytes"].isna().all()  # no DDP seen
    known = comm_calls([8 * MB], [0.01])
    by_ddp = sized_by_ddp(known, ddp_buckets(buckets=1, bucket_bytes=1.0))
    assert by_ddp["bytes"].tolist() == [8 * MB]


def test_caps_the_model_cannot_tell_apart_go_to_the_one_with_fewest_calls() -> None:
    """A latency-bound rank (150 all-reduces of 1 KiB a step) whose measured overlap is most of
    its communication, as gloo's queued calls on a CPU with no core to spare can look: 40
    buckets with that overlap and one bucket without it predict the same step to within noise;
    the model picks the single bucket, whose latency it is surest of, never a 4 KiB cap."""
    calls = comm_calls([1048] * 150, [0.0012] * 150)
    m = rank_comm(0, 2, comm_window(0.3, 0.18, 0.04), calls,
                  ddp_buckets(bucket_cap_bytes=1048, backward_compute_s=0.2), link_bytes_s=2.7e9)
    assert m is not None and m.buckets == 150
    model = CommModel(m, (*bucket_what_ifs(m), no_sync_what_if(m)), tuple(scaling(m)))
    caps = {w.value: w.speedup for w in model.what_ifs if w.fix == "bucket_cap"}
    assert caps[25.0] < max(caps.values())  # by a hair: what max() alone would not pick
    assert caps[25.0] >= max(caps.values()) * (1 - TIE) and max(caps.values()) > 1.1
    best = model.best("bucket_cap")
    assert best is not None and best.value == 25.0
    # a cap that gives clearly less is never picked for having fewer calls
    other = comm_model()
    caps = {w.value: w.speedup for w in other.what_ifs if w.fix == "bucket_cap"}
    picked = other.best("bucket_cap")
    assert picked is not None and picked.value is not None
    assert picked.speedup >= max(caps.values()) * (1 - TIE)
    assert any(v > picked.value and x < max(caps.values()) * (1 - TIE) for v, x in caps.items()
               if v is not None), caps


def test_a_job_accumulating_micro_batches_that_each_all_reduce_gets_its_own_no_sync() -> None:
    from doctor.analyse.comms import each_micro_batch_reduces

    # 4 micro-batches a step, each all-reducing DDP's 2 buckets: 8 all-reduces a step
    each = rank_comm(0, 2, comm_window(0.2, 0.1, 0.1), comm_calls([10 * MB] * 8, [0.0125] * 8),
                     ddp_buckets(buckets=2, bucket_bytes=20 * MB))
    assert each is not None
    assert each_micro_batch_reduces(each, 4.0, ddp_buckets(buckets=2)) == 4
    w = no_sync_what_if(each, micro_batches=4)
    assert w.exposed_s == pytest.approx(each.comm_s / 4) and w.value == 4  # one, whole
    assert "of the job's 4 micro-batches" in w.setting
    # the same 4 micro-batches in no_sync() but the last: 2 all-reduces a step, nothing to save
    quiet = rank_comm(0, 2, comm_window(0.2, 0.1, 0.1), comm_calls([10 * MB] * 2, [0.05] * 2),
                      ddp_buckets(buckets=2, bucket_bytes=20 * MB))
    assert quiet is not None
    assert each_micro_batch_reduces(quiet, 4.0, ddp_buckets(buckets=2)) == 0
    # one backward() a step: not accumulating (the fix then asks for it, every 4 steps)
    assert each_micro_batch_reduces(each, 1.0, ddp_buckets(buckets=2)) is None
    assert each_micro_batch_reduces(each, float("nan"), ddp_buckets(buckets=2)) is None
    # DDP's buckets unknown: at least one all-reduce a micro-batch
    assert each_micro_batch_reduces(each, 4.0, ddp_buckets().iloc[0:0]) == 4
