"""A CPU job whose step time goes to image transforms done by Pillow (preprocess, not decode):
the images are decoded once at start-up and kept in memory as loaded ``PIL.Image``s; each
``__getitem__`` runs a torchvision-style augmentation chain in Pillow on one of them (a random
resized crop, a rotation, colour jitter through ``ImageEnhance``, a Gaussian blur, a conversion
to greyscale and back) and hands out a small tensor; the model is a small MLP (``--hidden``).
Nothing is decoded while training: every frame inside Pillow is a transform.

Switch: ``--pretransformed`` transforms each image once at start-up and hands out the stored
tensor, removing the preprocess stage whole. ``--workers N`` sets DataLoader num_workers.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from PIL import Image, ImageEnhance, ImageFilter
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loop import add_ablation_arg, add_image_job_args, fit_job, image_mlp

OUT = 32  # side of the image the model sees


def images(count: int, size: int) -> list[Image.Image]:
    """Loaded RGB images in memory (no file, no codec)."""
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), "RGB")
            for _ in range(count)]


def augment(img: Image.Image, rng: np.random.Generator) -> torch.Tensor:
    """A random resized crop, rotation, colour jitter, blur and greyscale round trip, all in
    Pillow, then a resize to OUT x OUT."""
    side = img.size[0]
    crop = int(side * rng.uniform(0.5, 0.9))
    x, y = (int(v) for v in rng.integers(0, side - crop, 2))
    out = img.crop((x, y, x + crop, y + crop)).resize((side, side), Image.BICUBIC)
    out = out.rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        out = enhance(out).enhance(float(rng.uniform(0.7, 1.3)))
    out = out.filter(ImageFilter.GaussianBlur(radius=1.5))
    out = out.convert("L").convert("RGB")
    small = np.asarray(out.resize((OUT, OUT), Image.BILINEAR), dtype=np.float32) / 256.0
    return torch.from_numpy(small.transpose(2, 0, 1).copy())


class PilDataset(Dataset):
    def __init__(self, pictures: list[Image.Image], n: int, pretransformed: bool) -> None:
        self.pictures, self.n = pictures, n
        rng = np.random.default_rng(1)
        self.done = [augment(p, rng) for p in pictures] if pretransformed else None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        k = i % len(self.pictures)
        if self.done is not None:
            return self.done[k], i % 10
        return augment(self.pictures[k], np.random.default_rng(i)), i % 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_image_job_args(ap, 16, "distinct images, used in turn", 256, "image side in pixels", 512)
    ap.add_argument("--pretransformed", action="store_true",
                    help="transform each image once at start-up: removes the bottleneck")
    add_ablation_arg(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    pictures = images(args.images, args.size)
    n = args.batch * args.steps

    def loader(pretransformed: bool) -> DataLoader:
        return DataLoader(PilDataset(pictures, n, pretransformed), batch_size=args.batch,
                          shuffle=False, num_workers=args.workers)

    model = image_mlp(OUT, args.hidden)
    timer = fit_job(args, args.pretransformed, loader, model)
    timer.report(job="pil_transforms", augment=not args.pretransformed, workers=args.workers)


if __name__ == "__main__":
    main()
