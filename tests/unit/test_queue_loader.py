"""A loader of the job's own: a thread fills a queue, the loop waits in ``queue.get``. The wait
is input, split by the producer thread's samples (doctor.store.stacks.parse_producers,
doctor.analyse.frames.waits_on_queue, doctor.analyse.split.outside_loader_shares), and
input.outside_loader names the queue."""

from __future__ import annotations

import pandas as pd

from doctor.analyse.frames import waits_on_queue
from doctor.analyse.split import OutsideLoader, outside_loader_shares
from doctor.rules.input_outside import QUEUE_FIXES, input_outside_loader
from doctor.store.stacks import StackSamples, parse_producers, parse_raw
from doctor.verdict import CATEGORIES
from tests.support import evidence


def ledger(n: int = 30) -> pd.DataFrame:
    """Steps of 10 ms, all compute (the queue's wait is moved by the ledger, not here)."""
    row = dict.fromkeys(CATEGORIES, 0.0)
    return pd.DataFrame([{"rank": 0, "step": i + 1, "start_s": float(i), **row,
                          "compute": 0.01, "wall_s": 0.01, "wait_s": 0.0, "warmup": False,
                          "analyzed": True} for i in range(n)])

LOOP = ("<module> (train.py:90)", "main (train.py:70)")
GET = (*LOOP, "Queue.get (queue.py:180)", "Condition.wait (threading.py:355)")
FORWARD = (*LOOP, "Module._call_impl (torch/nn/modules/module.py:1750)")
PRODUCER = ("Thread._bootstrap (threading.py:1002)", "Thread.run (threading.py:982)",
            "producer (train.py:40)", "make_batch (train.py:30)")
RAW = "\n".join([
    f"thread (0x10): MainThread;{';'.join(GET)} 40",
    f"thread (0x10): MainThread;{';'.join(FORWARD)} 60",
    f"thread (0x20): Thread-1;{';'.join(PRODUCER)};augment (train.py:20) 30",
    f"thread (0x20): Thread-1;{';'.join(PRODUCER)};load (numpy/lib/_npyio_impl.py:455) 10",
    f"thread (0x20): Thread-1;{';'.join(PRODUCER[:3])};Queue.put (queue.py:140);"
    "Condition.wait (threading.py:355) 50",  # a full queue: not loading
    "thread (0x30): tqdm;Thread.run (threading.py:982);TMonitor.run (tqdm/_monitor.py:60) 99",
])


def test_the_threads_that_put_into_a_queue_are_the_producers() -> None:
    producers = parse_producers(RAW, main_thread=0x10)
    assert sum(producers.values()) == 40  # their put waits and other threads left out
    assert all("Queue.put (queue.py:140)" not in s for s in producers)
    assert sum(parse_raw(RAW, main_thread=0x10).values()) == 100
    assert parse_producers("a (x.py:1);b (y.py:2) 5", main_thread=1) == {}  # no thread frames


def test_a_wait_in_queue_get_outside_the_model_is_the_loops_wait_for_input() -> None:
    assert waits_on_queue(GET)
    assert waits_on_queue((*LOOP, "get (multiprocessing/queues.py:100)"))
    assert not waits_on_queue(FORWARD)
    # the DataLoader's own queue wait is its wait, measured apart
    assert not waits_on_queue((*LOOP, "_MultiProcessingDataLoaderIter._next_data "
                                      "(torch/utils/data/dataloader.py:1400)",
                               "get (multiprocessing/queues.py:100)"))


def samples(raw: str = RAW) -> StackSamples:
    return StackSamples(parse_raw(raw, main_thread=0x10), "py-spy", 50.0, (0, 2 * 10**9), 339,
                        parse_producers(raw, main_thread=0x10))


def test_the_wait_is_split_by_what_the_producer_does() -> None:
    found = outside_loader_shares(samples())
    assert found.queue_share == 0.4
    # the producer: 30 samples in its own code (preprocess), 10 reading (io)
    assert found.shares["preprocess"] == 0.4 * 0.75 and found.shares["io"] == 0.4 * 0.25
    assert found.shares["decode"] == 0.0
    # a producer never sampled: the wait is the job's own input code
    alone = outside_loader_shares(samples("\n".join(RAW.splitlines()[:2])))
    assert alone.shares["preprocess"] == 0.4 and alone.queue_share == 0.4


def test_the_finding_names_the_queue_and_the_fixes_that_fit() -> None:
    outside = OutsideLoader({"io": 0.1, "decode": 0.0, "preprocess": 0.3}, ("augment",), 0.4)
    [finding] = input_outside_loader(evidence(ledger=ledger(), outside_loader=outside))
    assert finding.title.startswith("The training loop waits 40% of the step on a queue")
    assert finding.category == "preprocess" and finding.fixes == QUEUE_FIXES
    assert finding.evidence["queue_wait_share"] == 0.4
    # batches built on the loop's own thread keep their finding
    inline = OutsideLoader({"io": 0.0, "decode": 0.0, "preprocess": 0.4}, ("get_batch",))
    [other] = input_outside_loader(evidence(ledger=ledger(), outside_loader=inline))
    assert other.title.endswith("outside a DataLoader") and other.fixes != QUEUE_FIXES
