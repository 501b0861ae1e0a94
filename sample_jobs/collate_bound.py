"""A CPU job whose step time goes to collation (preprocess): samples are token sequences of
varying length, and the DataLoader's ``collate_fn`` pads them and builds the attention mask in
pure Python, element by element; the model is an embedding bag and a small MLP (``--hidden``).

Switch: ``--fast-collate`` uses a vectorised collate (one numpy slice assignment per sequence),
removing the bottleneck, so the collate share can be measured by ablation. ``--workers N`` sets
DataLoader num_workers. The token sequences are generated into a temporary directory at
start-up (``.npy`` files, loaded into memory before training), or into ``--data DIR``.
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

VOCAB = 1000
PAD = 0
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Sample = tuple[np.ndarray, int]


def write_tokens(root: str, count: int, max_len: int) -> tuple[str, str]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(max_len // 4, max_len + 1, count)
    tokens = rng.integers(1, VOCAB, int(lengths.sum()), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tok_path, off_path = os.path.join(root, "tokens.npy"), os.path.join(root, "offsets.npy")
    np.save(tok_path, tokens)
    np.save(off_path, offsets)
    return tok_path, off_path


class TokenDataset(Dataset):
    def __init__(self, tok_path: str, off_path: str, n: int) -> None:
        self.tokens, self.offsets = np.load(tok_path), np.load(off_path)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Sample:
        k = i % (len(self.offsets) - 1)
        return self.tokens[self.offsets[k]:self.offsets[k + 1]], i % 10


def slow_collate(batch: list[Sample]) -> Batch:
    """Pads and masks token by token in Python, the way many hand-written collates do."""
    longest = 0
    for seq, _ in batch:
        longest = max(longest, len(seq))
    ids: list[list[int]] = []
    mask: list[list[float]] = []
    for seq, _ in batch:
        row: list[int] = []
        row_mask: list[float] = []
        for j in range(longest):
            if j < len(seq):
                row.append(int(seq[j]))
                row_mask.append(1.0)
            else:
                row.append(PAD)
                row_mask.append(0.0)
        ids.append(row)
        mask.append(row_mask)
    labels = [label for _, label in batch]
    return torch.tensor(ids), torch.tensor(mask), torch.tensor(labels)


def fast_collate(batch: list[Sample]) -> Batch:
    longest = max(len(seq) for seq, _ in batch)
    ids = np.full((len(batch), longest), PAD, dtype=np.int64)
    mask = np.zeros((len(batch), longest), dtype=np.float32)
    for i, (seq, _) in enumerate(batch):
        ids[i, :len(seq)] = seq
        mask[i, :len(seq)] = 1.0
    labels = torch.tensor([label for _, label in batch])
    return torch.from_numpy(ids), torch.from_numpy(mask), labels


class BagModel(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16, padding_idx=PAD)
        self.head = nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                  nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pooled = (self.embed(ids) * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.head(pooled)


def train(args: argparse.Namespace, root: str) -> None:
    tok_path, off_path = write_tokens(root, args.sequences, args.max_len)
    data = TokenDataset(tok_path, off_path, args.batch * args.steps)

    def loader(fast: bool) -> DataLoader:
        return DataLoader(data, batch_size=args.batch, shuffle=False, num_workers=args.workers,
                          collate_fn=fast_collate if fast else slow_collate)

    model = BagModel(args.hidden)
    timer = fit_job(args, args.fast_collate, loader, model)
    timer.report(job="collate_bound", fast_collate=args.fast_collate, workers=args.workers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sequences", type=int, default=512, help="distinct sequences, used in turn")
    ap.add_argument("--max-len", type=int, default=1024, help="longest sequence, in tokens")
    ap.add_argument("--hidden", type=int, default=256,
                    help="MLP width: the compute part (20-25 %% of the step, --workers 0)")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    ap.add_argument("--fast-collate", action="store_true",
                    help="vectorised collate: removes the bottleneck")
    add_ablation_arg(ap)
    ap.add_argument("--data", help="directory for the token files (default: a temporary one)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # a small model: one thread is plenty, and steadier
    torch.manual_seed(0)
    in_data_dir(args.data, "doctor-collate-", lambda root: train(args, root))


if __name__ == "__main__":
    main()
