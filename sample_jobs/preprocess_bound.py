"""A CPU job whose step time goes to augmentation (preprocess): ``__getitem__`` takes a raw image
already in memory and runs a heavy chain of numpy and torch CPU transforms on it (random crop and
flip, colour jitter, blur, sharpen and edge filters built from shifted sums in Python loops over
channels and taps, per-channel normalisation); the model is a small MLP (``--hidden``).

Switch: ``--pretransformed`` transforms each distinct raw image once at start-up (centre crop,
normalisation, pooling) and hands out the stored tensor, removing the preprocess stage whole, so
its share can be measured by ablation (a switch that kept a cheaper transform would measure the
augmentation only). ``--workers N``
sets DataLoader num_workers. The raw images are generated into a temporary directory at start-up
(one ``.npy`` file, loaded into memory before training), or into ``--data DIR``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loop import add_ablation_arg, add_image_job_args, fit_job, image_mlp, in_data_dir

CROP = 96   # side of the crop the model sees, before pooling
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BLUR = np.full((3, 3), 1 / 9, dtype=np.float32)
SHARPEN = np.array([[0, -1, 0], [-1, 5, -1], [0, -1, 0]], dtype=np.float32)
SOBEL_X = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.float32)


def write_images(root: str, count: int, size: int) -> str:
    rng = np.random.default_rng(0)
    path = os.path.join(root, "images.npy")
    np.save(path, rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8))
    return path


def filter3x3(chan: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """A 3x3 'convolution' as nine shifted, weighted sums (edge-padded)."""
    padded = np.pad(chan, 1, mode="edge")
    h, w = chan.shape
    out = np.zeros_like(chan)
    for dy in range(3):
        for dx in range(3):
            if kernel[dy, dx]:
                out += kernel[dy, dx] * padded[dy:dy + h, dx:dx + w]
    return out


def augment(img: np.ndarray, rng: np.random.Generator, passes: int) -> torch.Tensor:
    h, w, _ = img.shape
    y, x = rng.integers(0, h - CROP + 1), rng.integers(0, w - CROP + 1)
    crop = img[y:y + CROP, x:x + CROP].astype(np.float32) / 255.0
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    chans = []
    for c in range(3):
        chan = np.ascontiguousarray(crop[:, :, c])
        chan = chan * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1)  # brightness/contrast
        for _ in range(passes):
            chan = filter3x3(chan, BLUR)
            chan = filter3x3(chan, SHARPEN)
            edges = filter3x3(chan, SOBEL_X)
            chan = np.clip(chan + 0.1 * edges, 0.0, 1.0)
        chans.append((chan - MEAN[c]) / STD[c])
    out = torch.from_numpy(np.stack(chans))
    return torch.nn.functional.avg_pool2d(out.unsqueeze(0), 4).squeeze(0)  # torch op too


def plain(img: np.ndarray) -> torch.Tensor:
    h, w, _ = img.shape
    y, x = (h - CROP) // 2, (w - CROP) // 2
    crop = img[y:y + CROP, x:x + CROP].astype(np.float32) / 255.0
    norm = (crop - np.array(MEAN, dtype=np.float32)) / np.array(STD, dtype=np.float32)
    out = torch.from_numpy(np.ascontiguousarray(norm.transpose(2, 0, 1)))
    return torch.nn.functional.avg_pool2d(out.unsqueeze(0), 4).squeeze(0)


class AugmentDataset(Dataset):
    def __init__(self, path: str, n: int, augment: bool, passes: int) -> None:
        self.images = np.load(path)
        self.n, self.passes = n, passes
        self.ready = None if augment else [plain(img) for img in self.images]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.ready is not None:
            return self.ready[i % len(self.ready)], i % 10
        img = self.images[i % len(self.images)]
        return augment(img, np.random.default_rng(i), self.passes), i % 10


def train(args: argparse.Namespace, root: str) -> None:
    path = write_images(root, args.images, args.size)
    n = args.batch * args.steps

    def loader(pretransformed: bool) -> DataLoader:
        return DataLoader(AugmentDataset(path, n, not pretransformed, args.passes),
                          batch_size=args.batch, shuffle=False, num_workers=args.workers)

    side = CROP // 4
    model = image_mlp(side, args.hidden)
    timer = fit_job(args, args.pretransformed, loader, model)
    timer.report(job="preprocess_bound", augment=not args.pretransformed, workers=args.workers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_image_job_args(ap, 64, "distinct raw images, used in turn", 128,
                       "raw image side in pixels", 512)
    ap.add_argument("--passes", type=int, default=4, help="filter passes per channel")
    ap.add_argument("--pretransformed", action="store_true",
                    help="transform each image once at start-up: removes the bottleneck")
    add_ablation_arg(ap)
    ap.add_argument("--data", help="directory for the raw images (default: a temporary one)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # a small model: one thread is plenty, and steadier
    torch.manual_seed(0)
    in_data_dir(args.data, "doctor-preprocess-", lambda root: train(args, root))


if __name__ == "__main__":
    main()
