"""The DDP probe (doctor.probes.ddp) on a real DistributedDataParallel (gloo, one rank, in a
process of its own): its settings and buckets in meta.json, then in the run's ``ddp`` frame;
and the links probe (doctor.probes.links).

The tests here run no job, process nor clock (tests/unit); those that do are in
tests/e2e/test_ddp_probe.py.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from doctor.probes import links

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without distributed")


def test_links_stated_and_loopback_measured() -> None:
    assert links.stated_gb_per_s({"DOCTOR_LINK_GBPS": "12.5"}) == 12.5
    assert links.stated_gb_per_s({"DOCTOR_LINK_GBPS": "fast"}) is None
    assert links.stated_gb_per_s({}) is None
    got = links.links({"DOCTOR_LINK_GBPS": "3"})
    assert got["stated_gb_per_s"] == 3.0 and got["loopback_gb_per_s"] > 0
    assert links.loopback_gb_per_s(8 * 2**20) > 0
