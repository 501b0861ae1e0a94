"""A CPU job whose step time goes to decoding images (decode): each sample is a PNG file that
``__getitem__`` decodes with ``PIL.Image.open(...).convert("RGB")`` and ``np.asarray``, followed by
a trivial transform (a strided downsample and scaling); the model is a small MLP (``--hidden``).

Switch: ``--predecoded`` decodes every image once before training and keeps the arrays, removing
the bottleneck, so the decode share can be measured by ablation; each sample still reads its file,
so that the switch removes the decoding and nothing else. ``--workers N`` sets DataLoader
num_workers. The images are encoded with Pillow into a temporary directory at start-up, or into
``--data DIR``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loop import add_ablation_arg, add_image_job_args, fit_job, image_mlp, in_data_dir

OUT = 32  # side of the image the model sees


def write_images(root: str, count: int, size: int, fmt: str) -> list[str]:
    """Blocky images with noise: realistic sizes for PNG (a few hundred KB at 512x512)."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        blocks = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        img = np.kron(blocks, np.ones((8, 8, 1), dtype=np.uint8)).astype(np.int16)
        img = (img + rng.integers(-20, 21, img.shape)).clip(0, 255).astype(np.uint8)
        path = os.path.join(root, f"img-{i:04d}.{fmt.lower()}")
        Image.fromarray(img).save(path, format=fmt)
        paths.append(path)
    return paths


def decode(path: str) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def transform(img: np.ndarray) -> torch.Tensor:
    """Trivial: a strided downsample to OUT x OUT, channels first, scaled to [0, 1)."""
    step = max(1, img.shape[0] // OUT)
    small = img[::step, ::step][:OUT, :OUT]
    return torch.from_numpy(small.transpose(2, 0, 1).astype(np.float32) / 256.0)


class ImageDataset(Dataset):
    def __init__(self, paths: list[str], n: int, predecoded: bool) -> None:
        self.paths, self.n = paths, n
        self.images = [decode(p) for p in paths] if predecoded else None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        k = i % len(self.paths)
        if self.images is None:
            img = decode(self.paths[k])
        else:
            with open(self.paths[k], "rb") as f:  # the read stays, as with a faster decoder
                f.read()
            img = self.images[k]
        return transform(img), i % 10


def train(args: argparse.Namespace, root: str) -> None:
    paths = write_images(root, args.images, args.size, args.format)
    n = args.batch * args.steps

    def loader(predecoded: bool) -> DataLoader:
        return DataLoader(ImageDataset(paths, n, predecoded), batch_size=args.batch,
                          shuffle=False, num_workers=args.workers)

    model = image_mlp(OUT, args.hidden)
    timer = fit_job(args, args.predecoded, loader, model)
    timer.report(job="decode_bound", predecoded=args.predecoded, workers=args.workers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_image_job_args(ap, 32, "distinct images, decoded in turn", 512, "image side in pixels",
                       1024)
    ap.add_argument("--format", choices=["PNG", "JPEG"], default="PNG")
    ap.add_argument("--predecoded", action="store_true",
                    help="decode once before training: removes the bottleneck")
    add_ablation_arg(ap)
    ap.add_argument("--data", help="directory for the images (default: a temporary one)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # a small model: one thread is plenty, and steadier
    torch.manual_seed(0)
    in_data_dir(args.data, "doctor-decode-", lambda root: train(args, root))


if __name__ == "__main__":
    main()
