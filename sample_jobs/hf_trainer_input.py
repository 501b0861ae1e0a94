"""A CPU job under the Hugging Face Trainer whose step waits for input: each sample is built by a
slow pure-Python transform in ``__getitem__``, loaded in the training process
(``dataloader_num_workers=0``, the Trainer's default), for a tiny MLP.

Switch: ``--workers N`` sets ``TrainingArguments(dataloader_num_workers=N)``: workers build the
next batches while the model trains. Needs ``transformers`` (and ``accelerate``), which doctor
itself does not: ``pip install transformers accelerate``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer

try:
    from transformers import Trainer, TrainerCallback, TrainingArguments
except ImportError:
    sys.exit("hf_trainer_input.py needs the Hugging Face Trainer: "
             "pip install transformers accelerate")

FEATURES = 32


class SlowDataset(torch.utils.data.Dataset):
    def __init__(self, n: int, work: int) -> None:
        self.n, self.work = n, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = [sum(math.sin(i * 1e-3 + j * 1e-2 + k * 1e-4) for k in range(self.work)) / self.work
               for j in range(FEATURES)]
        return {"x": torch.tensor(row), "labels": torch.tensor(i % 4)}


class Tiny(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, 4))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Timed(TrainerCallback):
    def __init__(self, timer: StepTimer) -> None:
        self.timer = timer

    def on_step_end(self, *args: object, **kwargs: object) -> None:
        self.timer.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--work", type=int, default=120, help="inner loop length per feature")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--workers", type=int, default=0, help="dataloader_num_workers")
    args = ap.parse_args()
    torch.manual_seed(0)
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out, per_device_train_batch_size=args.batch, max_steps=args.steps,
            dataloader_num_workers=args.workers, report_to=[], save_strategy="no",
            logging_strategy="no", use_cpu=True, disable_tqdm=True)
        trainer = Trainer(model=Tiny(args.hidden), args=training,
                          train_dataset=SlowDataset(args.batch * (args.steps + 1), args.work),
                          callbacks=[Timed(timer)])
        timer.last = time.perf_counter()
        trainer.train()
    timer.report(job="hf_trainer_input", workers=args.workers)


if __name__ == "__main__":
    main()
