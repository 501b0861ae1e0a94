"""Batches that do not come from a DataLoader: built in the training loop itself (nanoGPT's
get_batch), or taken from a queue that a thread of the job fills (a loader of its own); what
doctor.analyse.split found of them in the training thread's stack samples.
"""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.rules.base import rule
from doctor.rules.input import MIN_SHARE, input_severity
from doctor.verdict import Finding, Fix


@rule("input.outside_loader", needs=("ledger", "outside_loader"))
def input_outside_loader(ev: Evidence) -> list[Finding]:
    """Batches built in the training loop itself (no DataLoader): nothing overlaps them; or
    batches the loop waits for on a queue a thread of its own fills."""
    assert ev.outside_loader is not None
    shares: dict[str, float] = dict(ev.outside_loader.stage_shares_of_step)
    share = sum(shares.values())
    if share < MIN_SHARE:
        return []
    stage = max(shares, key=lambda s: shares[s])
    top = list(ev.outside_loader.top)
    queued = ev.outside_loader.queue_share_of_step
    evidence = {"share_of_step": share, **{f"{s}_share": v for s, v in shares.items()},
                "top_functions": top, "queue_wait_share": queued}
    if queued >= share / 2:
        return [Finding(
            id="input.outside_loader", category=stage, severity=input_severity(share),
            title=f"The training loop waits {queued:.0%} of the step on a queue that a thread "
                  f"of the job fills ({stage}, mostly)",
            evidence=evidence, fixes=QUEUE_FIXES,
            estimated_speedup=1.0 / max(1.0 - queued, 0.05))]
    return [Finding(
        id="input.outside_loader", category=stage, severity=input_severity(share),
        title=f"{share:.0%} of the step builds batches in the training loop, outside a "
              "DataLoader",
        evidence=evidence,
        fixes=(
            Fix(title="Build batches in DataLoader workers so they overlap training",
                why=f"{top[0] if top else 'The batch builder'} runs on the training thread: "
                    "nothing else happens meanwhile.",
                code="class Batches(torch.utils.data.IterableDataset):\n"
                     "    def __iter__(self):\n        while True:\n"
                     "            yield get_batch('train')\n\n"
                     "loader = DataLoader(Batches(), batch_size=None, num_workers=2"
                     + (", pin_memory=True)" if ev.job.device == "cuda" else ")")),
            Fix(title="Or prefetch the next batch in a background thread",
                why="Slicing memory-mapped arrays and numpy work release the GIL for much of "
                    "their time.",
                code="from concurrent.futures import ThreadPoolExecutor\n"
                     "pool = ThreadPoolExecutor(1)\nnext_batch = pool.submit(get_batch, 'train')\n"
                     "for step in range(steps):\n    x, y = next_batch.result()\n"
                     "    next_batch = pool.submit(get_batch, 'train')"),
        ),
        estimated_speedup=1.0 / max(1.0 - share, 0.05),
    )]


QUEUE_FIXES = (
    Fix(title="Build the batches in DataLoader worker processes",
        why="A thread of the training process shares its interpreter lock: Python work in it "
            "(decoding, transforms) runs one piece at a time with the loop's own, and one "
            "producer thread cannot build batches faster than it does alone. Worker processes "
            "build several batches at once, beside the loop.",
        code="class Batches(torch.utils.data.IterableDataset):\n"
             "    def __iter__(self):\n        while True:\n"
             "            yield make_batch()   # what the thread did\n\n"
             "loader = DataLoader(Batches(), batch_size=None, num_workers=4,\n"
             "                    persistent_workers=True, prefetch_factor=4)"),
    Fix(title="Or more producer threads, where the loading waits on storage or the network",
        why="Reads and most C decoders release the lock: several threads overlap their waits.",
        code="threads = [threading.Thread(target=producer, args=(queue,), daemon=True)\n"
             "           for _ in range(4)]\nfor t in threads:\n    t.start()"),
)
