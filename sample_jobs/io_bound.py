"""A CPU job whose step time goes to storage reads (io): each sample is a file of a few MB, and
``__getitem__`` drops the file's pages from the page cache (``posix_fadvise(DONTNEED)``) before
reading it with ``np.fromfile``, so every read goes to the disk. Little CPU work follows the read
(a strided subsample), and the model is a small MLP (``--hidden``).

Switch: ``--cached`` serves the reads from the page cache: the same reads of the same files
(their own copy, read once before training and never dropped), so only the storage wait goes,
which is what the io share says and what a local or in-memory copy of a dataset gives.
``--cache memory`` keeps the sample arrays in memory instead, which also saves the reads'
copies into fresh buffers and their passes through the CPU caches. ``--cache shards`` packs
the same samples into one large file read from the disk as before (its pages dropped at each
pass over it), a sample a slice read at its offset: the fix for many small files (one open,
sequential reads the kernel reads ahead), not a cache. ``--workers N`` sets
DataLoader num_workers. The files are written (and fsync'ed, so their pages can be dropped) into a
temporary directory at start-up, or into ``--data DIR``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loop import add_ablation_arg, fit_job, in_data_dir

FEATURES = 256


def write_files(root: str, count: int, size_mb: float) -> list[str]:
    """Random (incompressible) sample files, synced to disk so that DONTNEED can evict them."""
    rng = np.random.default_rng(0)
    nbytes = int(size_mb * (1 << 20)) // FEATURES * FEATURES
    paths = []
    for i in range(count):
        path = os.path.join(root, f"sample-{i:04d}.bin")
        with open(path, "wb") as f:
            f.write(rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes())
            f.flush()
            os.fsync(f.fileno())
        paths.append(path)
    return paths


def read_file(path: str, uncached: bool) -> np.ndarray:
    """Read a whole file: from the disk when ``uncached`` (its pages dropped first), else from
    wherever its pages are."""
    with open(path, "rb") as f:
        if uncached:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return np.fromfile(f, dtype=np.uint8)


def features(raw: np.ndarray) -> torch.Tensor:
    """Cheap: one byte of every FEATURES-th block, scaled to [0, 1)."""
    return torch.from_numpy(raw.reshape(FEATURES, -1)[:, 0].astype(np.float32) / 256.0)


def write_shard(root: str, paths: list[str]) -> str:
    """The sample files packed, in order, into one file (synced, so that DONTNEED evicts it)."""
    shard = os.path.join(root, "samples.shard")
    with open(shard, "wb") as out:
        for path in paths:
            with open(path, "rb") as f:
                out.write(f.read())
        out.flush()
        os.fsync(out.fileno())
    return shard


class ShardDataset(Dataset):
    """The samples of ``count`` files of ``nbytes`` each, packed into one shard: each read a
    slice at its offset, the shard's pages dropped as each pass over it begins (cold reads, as
    the files'), its descriptor opened once per process."""

    def __init__(self, shard: str, count: int, nbytes: int, n: int) -> None:
        self.shard, self.count, self.nbytes, self.n = shard, count, nbytes, n
        self._fd: int | None = None
        self._pid = -1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self._fd is None or self._pid != os.getpid():  # a worker opens its own
            self._fd, self._pid = os.open(self.shard, os.O_RDONLY), os.getpid()
        k = i % self.count
        if k == 0:
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        raw = np.frombuffer(os.pread(self._fd, self.nbytes, k * self.nbytes), dtype=np.uint8)
        return features(raw), i % 10


class FileDataset(Dataset):
    """``cache``: None reads every sample from the disk, "page" from the page cache, "memory"
    from arrays read once."""

    def __init__(self, paths: list[str], n: int, cache: str | None) -> None:
        self.paths, self.n, self.uncached = paths, n, cache is None
        warm = [read_file(p, uncached=False) for p in paths] if cache else []
        self.arrays = warm if cache == "memory" else None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        k = i % len(self.paths)
        raw = self.arrays[k] if self.arrays is not None else read_file(self.paths[k],
                                                                       self.uncached)
        return features(raw), i % 10


def train(args: argparse.Namespace, root: str) -> None:
    n = args.batch * args.steps

    def loader(cached: bool) -> DataLoader:
        # each side its own files: the uncached side's dropped pages never slow the cached one
        side = os.path.join(root, "cached" if cached else "uncached")
        os.makedirs(side, exist_ok=True)
        paths = write_files(side, args.files, args.file_mb)
        dataset: Dataset = (
            ShardDataset(write_shard(side, paths), len(paths), os.path.getsize(paths[0]), n)
            if cached and args.cache == "shards" else
            FileDataset(paths, n, args.cache if cached else None))
        return DataLoader(dataset, batch_size=args.batch, shuffle=False,
                          num_workers=args.workers)

    model = nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    timer = fit_job(args, args.cached, loader, model)
    timer.report(job="io_bound", cached=args.cached, cache=args.cache, workers=args.workers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--files", type=int, default=32, help="distinct sample files, read in turn")
    ap.add_argument("--file-mb", type=float, default=4.0, help="size of each sample file")
    ap.add_argument("--hidden", type=int, default=1536,
                    help="MLP width: the compute part (20-25 %% of the step, --workers 0)")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    ap.add_argument("--cached", action="store_true",
                    help="serve the reads from the page cache: removes the bottleneck")
    ap.add_argument("--cache", choices=("page", "memory", "shards"), default="page",
                    help="what --cached (or the switch of --ablate, --switch-after) caches: "
                         "the files' pages (default), or the sample arrays in memory; "
                         "shards: the samples packed into one file, read cold (the fix for "
                         "many small files)")
    add_ablation_arg(ap)
    ap.add_argument("--data", help="directory for the sample files (default: a temporary one)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # a small model: one thread is plenty, and steadier
    torch.manual_seed(0)
    in_data_dir(args.data, "doctor-io-", lambda root: train(args, root))


if __name__ == "__main__":
    main()
