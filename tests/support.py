"""Record synthetic training loops through a real Session driven by a fake clock.

What lands in the run directory is exactly what the probes write in a real job, so the ledger,
rules and verdict are tested on recorded data without sleeping or timing anything.
"""

from __future__ import annotations

from pathlib import Path

from doctor.record.session import STEP_DATALOADER, STEP_MANUAL, Session
from doctor.store.rundir import write_run_record


class FakeClock:
    def __init__(self, start_ns: int = 10**12) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += round(seconds * 1e9)


def record_loop(run_dir: Path, steps: int, *, wait_s: float = 0.0, compute_s: float = 0.01,
                optimizers: int = 1, use_optimizer: bool = True, manual: bool = False,
                slow_first: int = 0, rank: int = 0, loader: dict | None = None,
                clock: FakeClock | None = None,
                then: tuple[int, float, float] | None = None) -> Session:
    """A loop of ``steps`` iterations: wait for a batch, compute, step the optimizer(s); with
    ``then`` (steps, wait_s, compute_s), a second phase of the same loop follows."""
    clock = clock or FakeClock()
    session = Session(run_dir, rank=rank, clock=clock, window_start=10**9)
    loader_id = session.record_loader(loader or {"num_workers": 0, "batch_size": 32,
                                                 "pin_memory": False,
                                                 "persistent_workers": False})
    phases = [(steps, wait_s, compute_s), *([then] if then else [])]
    plan = [(w, c) for n, w, c in phases for _ in range(n)]
    for i, (wait_s, compute_s) in enumerate(plan):
        slow = 10.0 if i < slow_first else 1.0
        t0 = clock()
        clock.tick(wait_s * slow)
        session.record_interval("loader_wait", t0, clock(), loader_id)
        session.count_step(STEP_DATALOADER)
        clock.tick(compute_s * slow * 0.4)  # forward
        b0 = clock()
        clock.tick(compute_s * slow * 0.5)
        session.record_interval("backward", b0, clock())
        for k in range(optimizers):
            if use_optimizer:
                session.record_optimizer_start()
                clock.tick(compute_s * slow * 0.1 / optimizers)
                session.record_optimizer_end(k)
            else:
                clock.tick(compute_s * slow * 0.1 / optimizers)
        if manual:
            session.mark_step(STEP_MANUAL)
    session.close()
    return session


def write_record(run_dir: Path, exit_code: int | None = 0, cores: int = 2, **extra: object
                 ) -> None:
    write_run_record(run_dir, {"argv": ["python", "train.py"], "name": "train",
                               "t0_monotonic_s": 1000.0, "cores": cores,
                               "exit_code": exit_code, **extra})
