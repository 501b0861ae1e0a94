"""A CPU job under PyTorch Lightning whose step goes to the optimizer: Adam over hundreds of small
parameter tensors, each updated in turn, built in ``configure_optimizers``. Lightning steps it
with a closure (``optimizer.step(closure)``) that runs the forward and backward inside the
optimizer's step: the optimizer's own share is what is left of the step after the closure.

Switch: ``--fixed`` builds Adam with ``fused=True``: one kernel updates every tensor. Needs
``lightning``, which doctor itself does not: ``pip install lightning``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer
from optimizer_bound import arguments

try:
    import lightning as L
except ImportError:
    sys.exit("lightning_optimizer.py needs PyTorch Lightning: pip install lightning")


class ManySmall(L.LightningModule):
    def __init__(self, layers: int, fused: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(layers))
        self.fused = fused

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return nn.functional.mse_loss(x, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        fused = {"fused": True} if self.fused else {"foreach": False}
        return torch.optim.Adam(self.parameters(), lr=1e-3, **fused)


class Timed(L.Callback):
    def __init__(self, timer: StepTimer) -> None:
        self.timer = timer

    def on_train_batch_end(self, *args: object, **kwargs: object) -> None:
        self.timer.step()


def main() -> None:
    args = arguments(__doc__)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 16), torch.randn(4096, 16))
    timer = StepTimer()
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Timed(timer)])
    trainer.fit(ManySmall(args.layers, args.fixed),
                torch.utils.data.DataLoader(data, batch_size=32))
    timer.report(job="lightning_optimizer", fixed=args.fixed, tensors=2 * args.layers)


if __name__ == "__main__":
    main()
