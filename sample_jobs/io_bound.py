"""A CPU job whose step time goes to storage reads (io): each sample is a file of a few MB, and
``__getitem__`` drops the file's pages from the page cache (``posix_fadvise(DONTNEED)``) before
reading it with ``np.fromfile``, so every read goes to the disk. Little CPU work follows the read
(a strided subsample), and the model is a small MLP (``--hidden``).

Switch: ``--cached`` reads every file once before training and keeps the samples in memory,
removing the bottleneck, so the io share can be measured by ablation. ``--workers N`` sets
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


def read_uncached(path: str) -> np.ndarray:
    """Read a whole file from the disk, not from the page cache."""
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return np.fromfile(f, dtype=np.uint8)


def features(raw: np.ndarray) -> torch.Tensor:
    """Cheap: one byte of every FEATURES-th block, scaled to [0, 1)."""
    return torch.from_numpy(raw.reshape(FEATURES, -1)[:, 0].astype(np.float32) / 256.0)


class FileDataset(Dataset):
    def __init__(self, paths: list[str], n: int, cached: bool) -> None:
        self.paths, self.n = paths, n
        self.cache = [np.fromfile(p, dtype=np.uint8) for p in paths] if cached else None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        k = i % len(self.paths)
        raw = self.cache[k] if self.cache is not None else read_uncached(self.paths[k])
        return features(raw), i % 10


def train(args: argparse.Namespace, root: str) -> None:
    paths = write_files(root, args.files, args.file_mb)
    n = args.batch * args.steps

    def loader(cached: bool) -> DataLoader:
        return DataLoader(FileDataset(paths, n, cached), batch_size=args.batch, shuffle=False,
                          num_workers=args.workers)

    model = nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    timer = fit_job(args, args.cached, loader, model)
    timer.report(job="io_bound", cached=args.cached, workers=args.workers)


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
                    help="keep the samples in memory: removes the bottleneck")
    add_ablation_arg(ap)
    ap.add_argument("--data", help="directory for the sample files (default: a temporary one)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # a small model: one thread is plenty, and steadier
    torch.manual_seed(0)
    in_data_dir(args.data, "doctor-io-", lambda root: train(args, root))


if __name__ == "__main__":
    main()
