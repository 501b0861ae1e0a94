"""How the job's bytes arrive (doctor.analyse.reads) from the kernel's per-process io counters,
and the io fixes ordered by it (doctor.rules.input_reads): many small reads get shards first,
reads that wait on storage get a local copy first, page-cache reads get fewer larger reads."""

from __future__ import annotations

import pytest

from doctor.analyse.reads import KIB, read_pattern
from doctor.rules.input_reads import io_fixes
from doctor.verdict import Fix
from tests.support import read_counters as host

PLAIN = (Fix("Keep the data close: cache it", "", "copy"),
         Fix("Read with more concurrency", "", "workers"),
         Fix("Store samples in large sequential shards", "", "shards"))


def test_the_counters_give_the_mean_read_the_rate_and_the_storage_share() -> None:
    reads = read_pattern(host(read_kib=4, reads_per_s=2000, from_storage=0.25))
    assert reads is not None
    assert reads.mean_read_bytes == pytest.approx(4 * KIB)
    assert reads.reads_per_s == pytest.approx(2000)
    assert reads.storage_share == pytest.approx(0.25)
    assert reads.storage_mb_per_s == pytest.approx(2000 * 4 * KIB * 0.25 / 1e6)


def test_no_counters_or_no_reads_give_nothing() -> None:
    assert read_pattern(None) is None
    assert read_pattern(host(4, 2000, 0.5).drop(columns=["read_count"])) is None  # older run
    assert read_pattern(host(4, 0, 0.5)) is None


@pytest.mark.parametrize(("kib", "per_s", "storage", "first", "words"), [
    (4, 2000, 0.3, "shards", "Reads average 4.0 KiB, 2,000 a second: pack the small"),
    (256, 400, 0.95, "copy", "Reads wait on storage (100 MB/s from the device"),
    (256, 400, 0.0, "shards", "Reads come from the page cache (100% of it"),
])
def test_the_io_fixes_follow_the_reads(kib: float, per_s: float, storage: float, first: str,
                                       words: str) -> None:
    fixes = io_fixes(read_pattern(host(kib, per_s, storage)), PLAIN)
    assert fixes[0].title.startswith(words), fixes[0].title
    assert fixes[0].code == first
    assert sorted(f.code for f in fixes) == sorted(f.code for f in PLAIN)  # the same three
    assert io_fixes(None, PLAIN) == PLAIN
