"""Where the io stage's time goes when the data is not on a local disk, and the fix that fits:

- a remote store (the io samples are in a network client: sockets, http.client, urllib,
  requests, boto3, fsspec, ...): its throughput is the requests in flight times what one
  connection gives, so the fix is more requests in flight, sized from the measured waits (the
  loading waits, it does not compute: workers beyond the cores still help), by more DataLoader
  workers or the client's own parallelism, its setting named where the library is recognised;
- a network filesystem (NFS, Lustre, CIFS, an object store through FUSE) under the data files:
  stage the data on local disk or in /dev/shm first, with the speed the reads got and the
  dataset's size against the free space there.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from doctor.analyse.data_source import MIB, DataSource
from doctor.analyse.reads import ReadPattern
from doctor.rules.input_model import InputFacts, estimate_with_workers
from doctor.verdict import Fix

REMOTE, NETWORK_FS = "remote store", "network filesystem"
MAX_WORKERS = 16  # the most workers a fix applies (each is a process with its own memory)
MAX_IN_FLIGHT = 64
#: The frames of a network client, by file (as the frame rules shorten it).
NETWORK_CLIENT = re.compile(
    r"\((?:.*/)?(boto3|botocore|aiobotocore|s3transfer|s3fs|gcsfs|adlfs|fsspec/implementations/"
    r"http|huggingface_hub|aiohttp|httpx|httpcore|requests|urllib3|google/cloud/storage|"
    r"azure/storage|smart_open|obstore|socket\.py|ssl\.py|http/client\.py|urllib/request\.py|"
    r"webdataset/gopen|streaming/base/storage|datasets/(download|utils/file_utils)|"
    r"torchdata/datapipes/iter/load)")


@dataclass(frozen=True)
class Client:
    library: str
    setting: str  # the library's own concurrency, in words
    code: str  # with {k}: the requests in flight


#: The client's own parallelism, by the library its frames are in (first match wins).
CLIENTS: tuple[tuple[re.Pattern[str], Client], ...] = tuple(
    (re.compile(pattern), client) for pattern, client in (
        (r"(boto3|botocore|s3transfer|aiobotocore)/", Client(
            "boto3", "botocore's Config(max_pool_connections=...) (10 by default) with requests "
                     "from a thread pool, or TransferConfig(max_concurrency=...) for large objects",
            "from concurrent.futures import ThreadPoolExecutor\n"
            "from botocore.config import Config\n"
            "s3 = boto3.client('s3', config=Config(max_pool_connections={k}))\n"
            "with ThreadPoolExecutor({k}) as pool:\n"
            "    blobs = list(pool.map(lambda key: s3.get_object(Bucket=bucket, Key=key)"
            "['Body'].read(), keys))")),
        (r"(s3fs|gcsfs|adlfs|fsspec)/", Client(
            "fsspec", "fsspec's batched cat(paths, batch_size=...): one call fetches many "
                      "objects concurrently",
            "blobs = fs.cat(paths, batch_size={k})  # {{path: bytes}}, fetched concurrently")),
        (r"huggingface_hub/|datasets/", Client(
            "datasets", "a streaming dataset's shards spread over the workers "
                        "(n_shards >= num_workers)",
            "ds = load_dataset(name, streaming=True)  # or to_iterable_dataset(num_shards={k})\n"
            "loader = DataLoader(ds, batch_size=batch_size, num_workers={k})")),
        (r"streaming/", Client(
            "streaming", "StreamingDataset(predownload=...) downloads ahead of the loop",
            "dataset = StreamingDataset(remote=remote, local=local, predownload={k} * "
            "batch_size)")),
        (r"webdataset/", Client(
            "webdataset", "more shards read at once: WebLoader's workers, one shard stream each",
            "loader = wds.WebLoader(dataset, batch_size=None, num_workers={k})")),
        (r"torchdata/", Client(
            "torchdata", "a threaded map: ParallelMapper(method='thread', num_workers=...)",
            "from torchdata.nodes import ParallelMapper\n"
            "node = ParallelMapper(urls, map_fn=fetch, num_workers={k}, method='thread')")),
        (r"aiohttp/", Client(
            "aiohttp", "TCPConnector(limit=..., limit_per_host=...) with gathered requests",
            "connector = aiohttp.TCPConnector(limit={k}, limit_per_host={k})\n"
            "blobs = await asyncio.gather(*(fetch(session, u) for u in urls))")),
        (r"(requests|urllib3|httpx|httpcore)/", Client(
            "requests", "HTTPAdapter(pool_maxsize=...) with requests from a thread pool",
            "session.mount('https://', requests.adapters.HTTPAdapter(pool_maxsize={k}))\n"
            "with ThreadPoolExecutor({k}) as pool:\n"
            "    blobs = list(pool.map(lambda u: session.get(u).content, urls))")),
    ))
#: Plain http.client, urllib, sockets: a thread pool over a batch's items.
THREADS = Client(
    "a thread pool", "a thread pool over each batch's items (Dataset.__getitems__)",
    "from concurrent.futures import ThreadPoolExecutor\n"
    "pool = ThreadPoolExecutor({k})\n\n"
    "class Remote(Dataset):\n"
    "    def __getitems__(self, indices):  # the DataLoader asks for a batch at once\n"
    "        return list(pool.map(self.__getitem__, indices))")


def is_remote(top_io: list[str], source: DataSource | None) -> bool:
    """The io stage fetches over the network: its top function is a network client's, or the
    job fetched over connections and read no data file."""
    if top_io and NETWORK_CLIENT.search(top_io[0]):
        return True
    return source is not None and source.connections >= 1.0 and source.data is None and \
        bool(top_io) and any(NETWORK_CLIENT.search(t) for t in top_io)


def client_of(top_io: list[str]) -> Client:
    for label in top_io:
        for pattern, client in CLIENTS:
            if pattern.search(label):
                return client
    return THREADS


def in_flight_needed(x: InputFacts) -> int:
    """Requests in flight that hide the loading: a batch's fetches (``load`` seconds of
    waiting, one at a time) spread so that one batch arrives per step's own work."""
    _, load, own = _means(x)
    return max(x.workers + 1, 2, min(MAX_IN_FLIGHT, math.ceil(load / own)))


def speedup_in_flight(x: InputFacts, k: int, waiting: float) -> float:
    """The mean step now against the mean step with ``k`` requests in flight (the loading model
    of doctor.rules.input_model, the ``waiting`` fraction of loading holding no core, or less
    where the loading's measured CPU says so: a client's own Python counts as io, and burns a
    core)."""
    step, load, own = _means(x)
    return step / estimate_with_workers(load, own, x.free_cores, k,
                                        min(waiting, _measured_waiting(x, step, load, own)))


def _measured_waiting(x: InputFacts, step: float, load: float, own: float) -> float:
    """The share of a batch's loading that holds no core, from the CPU the parent measured:
    the workers' (summed) a step, or the training process's beyond the step's own work; 1.0
    where not measured."""
    if x.workers:
        cpu = x.worker_cores * step if x.worker_cores else None
    else:
        cpu = max(0.0, x.main_cores * step - own) if x.main_cores else None
    return 1.0 if cpu is None else min(1.0, max(0.0, 1.0 - cpu / load))


def _means(x: InputFacts) -> tuple[float, float, float]:
    """(step, one batch's loading, the step's own work), from the analysed steps' means: a
    waiting loader's waits come unevenly (two workers: a long wait, then a batch at once),
    so medians would read the step's own work as the wait's."""
    step = x.mean_step
    own = max(step * (1.0 - x.wait_share), 1e-3)
    load = step * x.wait_share if x.workers == 0 else step * x.workers
    return step, max(load, 1e-9), own


def remote_fixes(x: InputFacts, frac: float, top_io: list[str], source: DataSource | None
                 ) -> tuple[Fix, Fix]:
    """(more workers, the client's own parallelism), sized from the measured waits."""
    k = in_flight_needed(x)
    workers = min(k, MAX_WORKERS)
    estimate = speedup_in_flight(x, workers, frac)
    by_client = speedup_in_flight(x, k, frac)
    now = f"{max(x.workers, 1)} request{'s' if x.workers > 1 else ''} in flight"
    rate = source.received_mb_per_s if source is not None else None
    per = source.mb_per_s_per_connection if source is not None else None
    if source is not None and source.connections > 0:
        now = f"{source.connections:.1f} connections in flight"
    figures = ""
    if rate is not None and per is not None and rate > 0:
        step, _, own = _means(x)
        need = rate * step / own
        figures = (f" at {per:.2f} MB/s each ({rate:.2f} MB/s in all); the loop needs about "
                   f"{need:.1f} MB/s")
    client = client_of(top_io)
    more = Fix(
        title=f"A remote store: {now}{figures}: raise concurrency to {k} requests in flight "
              f"(num_workers={workers})",
        why=f"Each fetch waits on the store ({frac:.0%} of loading is in the network client) "
            "while its worker holds no core: throughput grows with the requests in flight, "
            f"and {k} of them deliver a batch in the step's own time. Workers beyond the cores "
            "still help, since they wait"
            + (f"; past {MAX_WORKERS} workers, use the client's own parallelism." if k > workers
               else "."),
        code=f"DataLoader(dataset, {x.batch}, num_workers={workers}, prefetch_factor=4, "
             "persistent_workers=True)",
        apply={"dataloader": {"num_workers": workers, "persistent_workers": True}},
        estimated_speedup=estimate)
    per_worker = max(1, math.ceil(k / max(x.workers, 1)))
    where = (f"keep {x.workers} worker{'s' if x.workers > 1 else ''} and let the client fetch "
             f"{per_worker} at once in each" if x.workers else
             f"let the client fetch {per_worker} at once in the training process")
    threads = Fix(
        title=f"Or {where}: {client.setting}",
        why=f"{client.library}: requests in flight cost a thread and a connection each, not a "
            "process.",
        code=client.code.format(k=per_worker), estimated_speedup=by_client)
    return more, threads


def staging_fix(source: DataSource, reads: ReadPattern | None) -> Fix | None:
    """Stage the data near the job where it is read from a network filesystem."""
    data = source.data
    if data is None or not source.network_filesystem:
        return None
    size = source.dataset_bytes
    speed = f"{reads.chars / reads.seconds / 1e6:.1f} MB/s" if reads and reads.seconds else \
        "an unmeasured speed"
    spots = source.staging(size * 1.1)
    where = spots[0].mount_point if spots else None
    room = (f"{size / MIB:,.0f} MiB at least, {where} has {spots[0].free_bytes / MIB:,.0f} MiB "
            "free" if where else f"{size / MIB:,.0f} MiB at least, more than the free space of "
            "local disk and /dev/shm: stage the shards the next epochs need, or cache on first "
            "read")
    target = "/dev/shm/dataset" if where == "/dev/shm" else "/tmp/dataset"
    return Fix(
        title=f"Cold reads from a {data.kind} ({data.fstype} at {data.mount_point}, {speed}): "
              f"stage the data on {'memory' if where == '/dev/shm' else 'local disk'} first",
        why=f"Every read crosses the network; a local copy reads at memory or disk speed. The "
            f"dataset: {room}.",
        code=f"import shutil\nshutil.copytree({data.mount_point!r} + '/...', {target!r}, "
             "dirs_exist_ok=True)")
