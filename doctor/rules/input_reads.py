"""The io fixes in the order the job's reads call for (doctor.analyse.reads): reads of a few
KiB each, many a second, are many small files (or small reads of a large one): pack them into
shards first, with the numbers; reads that wait on storage: keep the data close first, with the
speed storage gave; reads the page cache served: the time is the calls themselves, so fewer,
larger reads first. Without the counters, the fixes stay in their plain order.

Before these, where the data comes from (doctor.rules.input_remote): a remote store gets more
requests in flight first, a network filesystem a local copy first. The cause is said in the
finding's evidence (``cause``). Reads of many small pieces are small files only where data files
were seen read, or where the parent could not look (the counters count pipe and socket reads
too: a worker's batches, a client's answers).
"""

from __future__ import annotations

from dataclasses import replace

from doctor.analyse.data_source import DataSource
from doctor.analyse.reads import KIB, ReadPattern
from doctor.rules.input_model import InputFacts
from doctor.rules.input_remote import NETWORK_FS, REMOTE, is_remote, remote_fixes, staging_fix
from doctor.verdict import Fix

SMALL_READ = 64 * KIB  # a mean read this small...
MANY_READS = 200.0  # ...this many times a second: small files
FROM_STORAGE = 0.5  # this share of the bytes read from storage: the reads wait on it

CLOSE, MORE, SHARDS = 0, 1, 2  # the plain order: keep the data close, more workers, shards
SMALL_FILES, STORAGE, PAGE_CACHE = "small files", "storage", "page cache"


def io_cause(x: InputFacts, frac: float, reads: ReadPattern | None,
             source: DataSource | None, plain: tuple[Fix, ...], reads_saved: float | None = None
             ) -> tuple[str | None, tuple[Fix, ...]]:
    """(the io stage's cause, its fixes in the order it calls for); ``reads_saved``: the
    speedup of the io stage's time gone (the small files' shards' estimate)."""
    top = x.top.get("io", [])
    if is_remote(top, source):
        more, own = remote_fixes(x, frac, top, source)
        return REMOTE, (more, own, plain[CLOSE], plain[SHARDS])
    stage = staging_fix(source, reads) if source is not None else None
    if stage is not None:
        return NETWORK_FS, (stage, plain[MORE], plain[SHARDS])
    return read_cause(reads, _files_read(source)), io_fixes(reads, plain, source, reads_saved)


def read_cause(reads: ReadPattern | None, files_read: bool = True) -> str | None:
    if reads is None:
        return None
    if files_read and reads.mean_read_bytes <= SMALL_READ and reads.reads_per_s >= MANY_READS:
        return SMALL_FILES
    return STORAGE if reads.storage_share >= FROM_STORAGE else PAGE_CACHE


def io_fixes(reads: ReadPattern | None, plain: tuple[Fix, ...],
             source: DataSource | None = None, reads_saved: float | None = None
             ) -> tuple[Fix, ...]:
    """``plain`` (keep the data close, more concurrency, shards) ordered and worded by what the
    reads were (small files unless ``source`` saw fetches and no data file), with the files
    seen open a second where the parent looked; small files' shards estimated at
    ``reads_saved`` (a floor: the calls around each file go too), where the shards fix has no
    estimate of its own."""
    if reads is None:
        return plain
    close, more, shards = plain[CLOSE], plain[MORE], plain[SHARDS]
    kib = reads.mean_read_bytes / KIB
    cached = f"{1 - reads.storage_share:.0%} of it from the page cache"
    cause = read_cause(reads, _files_read(source))
    if cause == SMALL_FILES:
        shards = replace(shards, title=f"Reads average {kib:.1f} KiB, {reads.reads_per_s:,.0f} "
                                       "a second: pack the small files into large shards",
                         why="Each small file costs an open, a stat and a read call, and on "
                             f"network or cloud storage a round trip each ({cached}). Large "
                             "shards read sequentially (WebDataset tar files, or one "
                             "np.memmap'ed array) turn thousands of calls into a few. "
                             "Its estimate is the reads' own time, a floor: the calls around "
                             "each file (its open, a fresh buffer) go too." + _opens(source),
                         estimated_speedup=shards.estimated_speedup or reads_saved)
        return (shards, more, close)
    if cause == STORAGE:
        close = replace(close, title="Reads wait on storage "
                                     f"({reads.storage_mb_per_s:.0f} MB/s from the device, "
                                     f"{kib:.0f} KiB a read): keep the data close, on local "
                                     "disk or in memory")
        return (close, more, shards)
    shards = replace(shards, title=f"Reads come from the page cache ({cached}, {kib:.0f} KiB "
                                   "a read): the time is the reads' own calls; read fewer, "
                                   "larger pieces")
    return (shards, more, close)


def _files_read(source: DataSource | None) -> bool:
    """Whether small reads may be small files: unless the job fetched over connections and no
    data file was seen open (a small file is open for microseconds, so a scan may see none of
    them; a job that fetches reads its answers and its workers' batches in small pieces)."""
    return source is None or source.data is not None or source.connections < 1.0


def _opens(source: DataSource | None) -> str:
    """The files seen open a second and their mean size, in words ("" where not scanned)."""
    data = source.data if source is not None else None
    if source is None or data is None or not data.files_seen:
        return ""
    return (f" {source.files_seen_per_s:,.0f} distinct files were seen open a second, "
            f"{data.bytes_seen / data.files_seen / KIB:,.1f} KiB each on average (an estimate "
            "and a lower bound of the opens: a scan sees only the files open at its instant, "
            f"every {source.seconds / max(source.scans - 1, 1):.1g} s), on {data.kind} "
            f"({data.fstype}).")

