"""What it costs this machine to hand a tensor from a DataLoader worker to the training process.

With torch's default sharing strategy (``file_descriptor``) every tensor of a batch built in a
worker reaches the training process as a file descriptor: unpickling the batch connects to the
worker's resource-sharer thread, which wakes up and sends the descriptor back. The training
process blocks for that round trip once per tensor, whether the batch was expensive to build or
not, so the cost stays when a loading stage gets cheaper, and appears when batches move from the
training process to workers.

``doctor run`` measures the round trip once, after the job has exited, with the same
``multiprocessing.resource_sharer`` exchange against a sleeping child (the state a worker that
keeps up waits in), and records the median in run.json as ``fd_handoff_s``.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from multiprocessing.connection import Connection
from typing import Any

ROUNDS = 24
SETTLE_S = 0.001  # let the child fall asleep in recv() before each round trip
TIMEOUT_S = 5.0


def _serve(conn: Connection, rounds: int) -> None:
    from multiprocessing import resource_sharer

    for _ in range(rounds):
        read, write = os.pipe()
        conn.send(resource_sharer.DupFd(read))
        if not conn.recv():  # the parent has taken it (or gave up)
            break
        os.close(read)
        os.close(write)
    conn.close()


def fd_handoff_seconds(rounds: int = ROUNDS) -> float | None:
    """Median seconds to take one file descriptor from a sleeping child process through
    ``multiprocessing.resource_sharer``, or None where it cannot be measured (no fork)."""
    try:
        ctx: Any = multiprocessing.get_context("fork")
    except ValueError:
        return None
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_serve, args=(theirs, rounds), daemon=True)
    times: list[float] = []
    try:
        child.start()
        theirs.close()
        for _ in range(rounds):
            if not ours.poll(TIMEOUT_S):
                break
            handle = ours.recv()
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            fd = handle.detach()
            times.append(time.perf_counter() - t0)
            os.close(fd)
            ours.send(True)
    except (OSError, EOFError):
        pass
    finally:
        ours.close()
        child.join(TIMEOUT_S)
        if child.is_alive():
            child.kill()
            child.join()
    kept = times[2:]  # the first round trips also start the child's sharer thread
    return statistics.median(kept) if kept else None
