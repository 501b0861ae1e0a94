"""The phases beside the training steps (doctor.analyse.phase_steps): one finding per phase that
cost MIN_SHARE of the run or more, with the fix that fits it.

- ``phases.evaluation``: evaluate less often, or on fewer batches (its estimate: every other
  pass left out);
- ``phases.checkpoint``: save asynchronously (torch.distributed.checkpoint.async_save), with the
  bytes and the write speed measured (its estimate: the saves' time off the loop, an upper bound,
  since the copy to host memory stays), or less often where the saves are already asynchronous;
- ``phases.epoch_start``: ``persistent_workers=True`` where the training loader's workers start
  again at every epoch (its estimate: the epoch starts' time off the run);
- ``phases.logging``: log less often, hand the writing to a background thread, and read the
  loss off the device once per log, not once per step (its estimate: half the calls' time off
  the run).

Each estimate is the run's time over the run's time less what the fix saves. The rank whose
phase cost most speaks for the job.
"""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.analyse.phase_steps import PhaseSummary
from doctor.analyse.phases import CHECKPOINT, EPOCH_START, EVALUATION, LOGGING
from doctor.rules.base import rule
from doctor.units import human_bytes
from doctor.verdict import Finding, Fix

MIN_SHARE = 0.02  # a phase this share of the run or more gets a finding
WARNING_SHARE = 0.1

EVAL_LESS = Fix(
    title="Evaluate less often, or on fewer batches",
    why="Each evaluation pass stops training for its whole length. Half as many passes (or "
        "half the batches each) halves that; a fixed subset of the evaluation set keeps the "
        "numbers comparable from pass to pass.",
    code="from itertools import islice\n\nif step % (2 * EVAL_EVERY) == 0:        # half as often\n"
         "    model.eval()\n    with torch.inference_mode():\n"
         "        for batch in islice(val_loader, EVAL_BATCHES):   # or on fewer batches\n"
         "            evaluate(model, batch)\n    model.train()")
ASYNC_SAVE = Fix(
    title="Save checkpoints asynchronously",
    why="A synchronous save stops the loop until every byte is on disk. "
        "torch.distributed.checkpoint.async_save copies the state to host memory and writes "
        "it from a background thread while training goes on; wait for the previous save before "
        "starting the next.",
    code="import torch.distributed.checkpoint as dcp\n\npending = None\n...\n"
         "if step % SAVE_EVERY == 0:\n    if pending is not None:\n        pending.result()\n"
         "    pending = dcp.async_save({\"model\": model.state_dict(),\n"
         "                              \"optim\": optimizer.state_dict()},\n"
         "                             checkpoint_id=f\"ckpt/step{step}\")")
SAVE_LESS = Fix(
    title="Save checkpoints less often",
    why="The saves are asynchronous already; what is left on the loop is the copy to host "
        "memory at each save.",
    code="if step % (2 * SAVE_EVERY) == 0:\n    ...")


LOG_LESS = Fix(
    title="Log every N steps, and read the loss once per log",
    why="Each logging call runs on the training thread: formatting, the handlers' writes, a "
        "metrics client's serialisation. Logging every N steps divides that by N; summing the "
        "loss on the device and calling .item() only when logging also avoids a device sync per "
        "step.",
    code="running = torch.zeros((), device=device)\n...\nrunning += loss.detach()\n"
         "if step % LOG_EVERY == 0:\n"
         "    writer.add_scalar(\"loss\", (running / LOG_EVERY).item(), step)  # one sync\n"
         "    running.zero_()")
LOG_ASYNC = Fix(
    title="Write logs from a background thread",
    why="A handler that writes to a file, a socket or a remote service blocks the loop for as "
        "long as the write takes. A QueueHandler only puts the record in a queue; a "
        "QueueListener thread does the writing. TensorBoard's SummaryWriter already writes "
        "from a thread: leave flush() to it (flush_secs) rather than calling it in the loop.",
    code="import logging, logging.handlers, queue\n\nq = queue.SimpleQueue()\n"
         "listener = logging.handlers.QueueListener(q, *logger.handlers)\n"
         "logger.handlers = [logging.handlers.QueueHandler(q)]\nlistener.start()\n"
         "# TensorBoard: SummaryWriter(log_dir, max_queue=1000, flush_secs=120); no flush() "
         "per step")


def _speedup(whole: float, saved: float) -> float:
    return whole / (whole - saved) if whole > saved > 0 else 1.0


def _worst(ev: Evidence, kind: str) -> PhaseSummary | None:
    found = [p for p in ev.phases or () if p.kind == kind and p.share >= MIN_SHARE]
    return max(found, key=lambda p: p.seconds, default=None)


def _severity(p: PhaseSummary) -> str:
    return "warning" if p.share >= WARNING_SHARE else "info"


def _whole(p: PhaseSummary) -> float:
    """The run's time the phase's share is of."""
    return p.seconds / p.share if p.share > 0 else 0.0


def _evidence(p: PhaseSummary) -> dict[str, object]:
    return {k: v for k, v in p.to_dict().items() if k not in ("label", "phase")}


def _times(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


@rule("phases", needs=("phases",))
def phase_findings(ev: Evidence) -> list[Finding]:
    out = []
    p = _worst(ev, EVALUATION)
    if p is not None:
        speedup = _speedup(_whole(p), p.seconds / 2)
        batches = f" of {p.batches:.0f} batches" if p.batches else ""
        out.append(Finding(
            id="phases.evaluation", category="other", severity=_severity(p),
            title=f"Evaluation: {_times(p.count, 'pass', 'passes')}{batches}, {p.per_s:.2f} s "
                  f"each, {p.share:.0%} of the run (left out of the training shares)",
            evidence=_evidence(p),
            fixes=(Fix(EVAL_LESS.title, EVAL_LESS.why, EVAL_LESS.code,
                       estimated_speedup=speedup),),
            estimated_speedup=speedup))
    p = _worst(ev, CHECKPOINT)
    if p is not None:
        already = "torch.distributed.checkpoint.async_save" in p.kinds
        saved = p.seconds / 2 if already else p.seconds
        speedup = _speedup(_whole(p), saved)
        size = f" ({human_bytes(p.bytes / p.count)} each at " \
               f"{human_bytes(p.bytes_s)}/s)" if p.bytes and p.bytes_s else ""
        fix = SAVE_LESS if already else ASYNC_SAVE
        out.append(Finding(
            id="phases.checkpoint", category="other", severity=_severity(p),
            title=f"Checkpoints: {_times(p.count, 'save', 'saves')}, {p.per_s:.2f} s each{size}, "
                  f"{p.share:.0%} of the run (left out of the training shares)",
            evidence=_evidence(p),
            fixes=(Fix(fix.title, fix.why, fix.code, estimated_speedup=speedup),),
            estimated_speedup=speedup))
    p = _worst(ev, EPOCH_START)
    if p is not None and p.num_workers and not p.persistent_workers:
        speedup = _speedup(_whole(p), p.seconds)
        out.append(Finding(
            id="phases.epoch_start", category="other", severity=_severity(p),
            title=f"Epoch starts: {_times(p.count, 'start', 'starts')}, {p.per_s:.2f} s each "
                  f"restarting {p.num_workers} DataLoader workers, {p.share:.0%} of the run",
            evidence=_evidence(p),
            fixes=(Fix(
                title="persistent_workers=True: keep the workers between epochs",
                why="Without it, the loader shuts its workers down when an epoch ends and "
                    "starts new ones (a fresh process each, the dataset copied or imported "
                    "again) for the next, and the first batch waits for all of that.",
                code=f"DataLoader(dataset, num_workers={p.num_workers}, "
                     "persistent_workers=True)",
                apply={"dataloader": {"persistent_workers": True}},
                estimated_speedup=speedup),),
            estimated_speedup=speedup))
    p = _worst(ev, LOGGING)
    if p is not None:
        out.append(logging_finding(p))
    return out


def logging_finding(p: PhaseSummary) -> Finding:
    """The logging phase: its calls, their time and share, the fixes that cut it."""
    speedup = _speedup(_whole(p), p.seconds / 2)
    libraries = f" ({p.libraries})" if p.libraries else ""
    apart = " (its slow steps left out of the training shares)" if p.steps else ""
    return Finding(
        id="phases.logging", category="other", severity=_severity(p),
        title=f"Logging: {_times(p.count, 'call', 'calls')}{libraries}, {p.seconds:.2f} s, "
              f"{p.share:.0%} of the run{apart}",
        evidence=_evidence(p),
        fixes=(Fix(LOG_LESS.title, LOG_LESS.why, LOG_LESS.code, estimated_speedup=speedup),
               LOG_ASYNC),
        estimated_speedup=speedup)
