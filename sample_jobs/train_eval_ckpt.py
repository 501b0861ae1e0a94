"""A CPU job as real training runs are: an MLP trained from a DataLoader, an evaluation pass
every ``--eval-every`` steps over its own DataLoader under ``torch.no_grad()``, a checkpoint
(``torch.save`` of the model and the optimizer) every ``--ckpt-every`` steps, over several
epochs of its training set, and, with ``--log-every N``, the loss logged every N steps through
Python's logging to a deliberately slow handler (``--log-ms`` a record: a blocking write to a
slow remote service).

Switches: ``--no-eval`` and ``--no-ckpt`` remove the phases, ``--log-every 0`` (the default)
the logging; the training steps are the same either way, so doctor's verdict over the training
steps should be too.

The job times its own evaluation passes, saves and logging calls, and prints them with its step
times, one JSON line at the end: ``eval_s``/``eval_passes``/``eval_share``, ``ckpt_s``/
``ckpts``/``ckpt_share``/``ckpt_bytes``, ``log_s``/``log_calls``/``log_share`` and
``epoch_start_s``/``epochs``/``epoch_start_share`` (each epoch after the first, from the end of
the last step before it to its first batch: the loader's end and its iterator, with ``--workers
N`` the workers' shutdown and start unless ``--persistent``); shares of the loop's time.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer


def mlp(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def evaluate(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in batches:
            correct += int((model(x).argmax(1) == y).sum())
    model.train()
    return correct


def in_memory(data: TensorDataset, batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The evaluation set's batches sliced from its tensors: no DataLoader."""
    x, y = data.tensors
    for i in range(0, len(x), batch):
        yield x[i:i + batch], y[i:i + batch]


class SlowRemoteHandler(logging.Handler):
    """Writes each record to a file, then waits ``seconds``: a handler that sends to a slow
    remote service and blocks until it answers."""

    def __init__(self, path: str, seconds: float) -> None:
        super().__init__()
        self.path = path
        self.seconds = seconds

    def emit(self, record: logging.LogRecord) -> None:
        with open(self.path, "a") as f:
            f.write(self.format(record) + "\n")
        time.sleep(self.seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--epoch-steps", type=int, default=80, help="batches in an epoch")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=30)
    ap.add_argument("--eval-batches", type=int, default=24)
    ap.add_argument("--ckpt-every", type=int, default=40)
    ap.add_argument("--workers", type=int, default=0, help="training loader's workers")
    ap.add_argument("--persistent", action="store_true", help="persistent_workers=True")
    ap.add_argument("--no-eval", action="store_true", help="remove the evaluation passes")
    ap.add_argument("--eval-in-memory", action="store_true",
                    help="evaluate on batches sliced from the tensors, with no DataLoader")
    ap.add_argument("--no-ckpt", action="store_true", help="remove the checkpoints")
    ap.add_argument("--ckpt-dir", default=None, help="where to save (a temporary folder)")
    ap.add_argument("--log-every", type=int, default=0,
                    help="log the loss every N steps (0: no logging)")
    ap.add_argument("--log-ms", type=float, default=40.0,
                    help="what each log record costs its handler (ms)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = mlp(args.width, args.depth)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    n = args.batch * args.epoch_steps
    train = TensorDataset(torch.randn(n, args.width), torch.randint(0, 10, (n,)))
    val_n = args.batch * args.eval_batches
    val = TensorDataset(torch.randn(val_n, args.width), torch.randint(0, 10, (val_n,)))
    train_loader = DataLoader(train, batch_size=args.batch, shuffle=True,
                              num_workers=args.workers,
                              persistent_workers=args.persistent and args.workers > 0)
    val_loader = DataLoader(val, batch_size=args.batch)
    folder = args.ckpt_dir or tempfile.mkdtemp(prefix="doctor-ckpt-")
    logger = logging.getLogger("train_eval_ckpt")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(SlowRemoteHandler(os.path.join(folder, "train.log"), args.log_ms / 1e3))
    eval_s = ckpt_s = log_s = epoch_s = 0.0
    passes = saves = written = logs = epochs = 0
    timer = StepTimer()
    step = 0
    try:
        t_end = 0.0  # the last step's end
        while step < args.steps:
            first = step > 0  # an epoch after the first: from the last step of the one before
            for x, y in train_loader:  # (its loader's end, the workers' shutdown) to the first
                if first:  # batch of this one (its iterator, the workers' start)
                    epoch_s += time.perf_counter() - t_end
                    epochs += 1
                    first = False
                t0 = time.perf_counter()
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                timer.train(time.perf_counter() - t0)
                step += 1
                if args.log_every and step % args.log_every == 0:
                    value = loss.item()
                    t0 = time.perf_counter()
                    logger.info("step %d loss %.4f", step, value)
                    log_s += time.perf_counter() - t0
                    logs += 1
                if not args.no_eval and step % args.eval_every == 0:
                    t0 = time.perf_counter()
                    evaluate(model, in_memory(val, args.batch) if args.eval_in_memory
                             else val_loader)
                    eval_s += time.perf_counter() - t0
                    passes += 1
                if not args.no_ckpt and step % args.ckpt_every == 0:
                    t0 = time.perf_counter()
                    path = os.path.join(folder, f"step{step}.pt")
                    torch.save({"model": model.state_dict(), "optim": opt.state_dict(),
                                "step": step}, path)
                    ckpt_s += time.perf_counter() - t0
                    saves += 1
                    written += os.path.getsize(path)
                timer.step()
                t_end = time.perf_counter()
                if step >= args.steps:
                    break
    finally:
        if args.ckpt_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    loop_s = time.perf_counter() - timer.t_start
    timer.report(eval_s=round(eval_s, 4), eval_passes=passes, eval_share=round(eval_s / loop_s, 4),
                 ckpt_s=round(ckpt_s, 4), ckpts=saves, ckpt_share=round(ckpt_s / loop_s, 4),
                 ckpt_bytes=written, log_s=round(log_s, 4), log_calls=logs,
                 log_share=round(log_s / loop_s, 4), epoch_start_s=round(epoch_s, 4),
                 epochs=epochs, epoch_start_share=round(epoch_s / loop_s, 4))


if __name__ == "__main__":
    main()
