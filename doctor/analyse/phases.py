"""The phases of a run beside its training steps, found from what the job recorded: evaluation
passes, checkpoints and epoch starts (each rank's training process).

- **Evaluation**: a batch that no ``backward()`` or optimizer step follows before the next batch
  is not trained on. A run of such batches is an evaluation pass when it is longer than the ones
  an ordinary step has (a step that fetches two batches for one backward has one), or holds a
  batch asked for with autograd off (``torch.no_grad()``/``inference_mode()``: the DataLoader
  probe marks it). A pass runs from its loader's iterator made just before it (the workers'
  start), else its first batch's request, to the next training activity (a training batch, a
  backward, an optimizer step, a checkpoint), or its loader's end where none follows. An
  evaluation with no DataLoader (batches already in memory) is found by the model's mode: a
  stretch from ``model.eval()`` to ``model.train()`` (doctor.probes.eval_mode) in which no
  backward or optimizer step began, and no pass found from the batches lies.
- **Checkpoints**: each save the checkpoints probe recorded (doctor.probes.checkpoints), with
  the bytes written where known.
- **Logging**: each logging or metrics call of 1 ms or more the logging probe recorded
  (doctor.probes.logging_calls), with its library; every call's count and time, short ones
  included, come from the probe's counts (RankPhases' ``logging``).
- **Epoch starts**: each iterator of the training loader after its first (not an evaluation
  pass's): the call that found the loader exhausted (workers shut down), the iterator made
  (workers started), and the first batch's wait beyond the median training batch's.

Each occurrence is a few pieces of time (PhasePieces) on the process's clock; ``on_ledger``
moves them to the ledger's clock (seconds from the run's start). Marking steps, the summaries
and the phases as causes of slow steps are doctor.analyse.phase_steps'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from doctor.analyse.steps import NS, WINDOW, RankSteps
from doctor.store.records import (
    CHECKPOINT_KINDS,
    LOADER_ID_MASK,
    LOADER_NO_GRAD,
    LOG_KINDS,
    checkpoint_key_parts,
)
from doctor.store.rundata import RunData

EVALUATION, CHECKPOINT, EPOCH_START, LOGGING = "evaluation", "checkpoint", "epoch_start", \
    "logging"
PHASES = (EVALUATION, CHECKPOINT, EPOCH_START, LOGGING)
TRAIN = "train"  # the phase of a training step
LABELS = {EVALUATION: "evaluation", CHECKPOINT: "checkpoints", EPOCH_START: "epoch starts",
          LOGGING: "logging"}
MIN_EVAL_BATCHES = 2  # a pass of batches with autograd on holds at least this many
NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class PhasePieces:
    """One rank's occurrences of one phase: each a few pieces of time (``occurrence`` says whose)
    and, per occurrence, what it was (batches of a pass, bytes of a save, ...)."""

    kind: str
    start: np.ndarray  # each piece's start (ns on the process's clock, or s on the ledger's)
    end: np.ndarray
    occurrence: np.ndarray  # the occurrence each piece belongs to
    count: int
    detail: dict[str, np.ndarray] = field(default_factory=dict)  # per occurrence

    def seconds(self, scale: float = NS) -> np.ndarray:
        """The time of each occurrence (its pieces summed)."""
        return np.bincount(self.occurrence, weights=(self.end - self.start) * scale,
                           minlength=self.count)

    def first_start(self) -> np.ndarray:
        """Each occurrence's first piece's start."""
        out = np.full(self.count, np.inf)
        np.minimum.at(out, self.occurrence, self.start.astype(np.float64))
        return out


def _pieces(phase: str, spans: list[list[tuple[int, int]]], **detail: list[float]
             ) -> PhasePieces:
    starts = [s for occ in spans for s, e in occ if e > s]
    ends = [e for occ in spans for s, e in occ if e > s]
    owner = [i for i, occ in enumerate(spans) for s, e in occ if e > s]
    return PhasePieces(phase, np.asarray(starts, dtype=np.int64),
                       np.asarray(ends, dtype=np.int64),
                       np.asarray(owner, dtype=np.int64), len(spans),
                       {k: np.asarray(v, dtype=np.float64) for k, v in detail.items()})


def on_ledger(p: PhasePieces, origin_ns: int) -> PhasePieces:
    """``p`` on the ledger's clock: seconds from the run's start (``origin_ns``)."""
    return PhasePieces(p.kind, (p.start - origin_ns) * NS, (p.end - origin_ns) * NS,
                       p.occurrence, p.count, p.detail)


@dataclass(frozen=True)
class RankPhases:
    """One rank's phases (by kind, only those it had), on its process's clock, and its
    training loader's settings id (None: not known)."""

    rank: int
    phases: dict[str, PhasePieces]
    train_loader: int | None = None
    #: every logging call of the process, short ones too: (calls, seconds, the libraries)
    logging: tuple[float, float, str] | None = None


def find_phases(run: RunData, r: RankSteps) -> RankPhases:
    """The phases of one rank's training process (none for a trace's own steps)."""
    if r.kind == WINDOW:
        return RankPhases(r.rank, {})
    proc = r.process
    waits = run.intervals_of(proc, "loader_wait")
    marks = [run.intervals_of(proc, name) for name in ("backward", "optimizer")]
    mark_start = np.sort(np.concatenate([m[0] for m in marks]))
    mark_end = np.sort(np.concatenate([m[1] for m in marks]))
    ckpt = run.intervals_of(proc, "checkpoint")
    iters = run.intervals_of(proc, "loader_iter")
    ends = run.intervals_of(proc, "loader_end")
    out: dict[str, PhasePieces] = {}
    trained = _trained(waits[0], waits[1], mark_start)
    train_loader = None
    claimed_iters: set[int] = set()
    spans: list[list[tuple[int, int]]] = []
    batches: list[float] = []
    if len(mark_start) >= 2 and len(waits[0]):
        spans, batches, claimed_iters = _evaluation(waits, trained, mark_start, mark_end, ckpt[0],
                                                    iters, ends)
    moded = _mode_passes(run.intervals_of(proc, "eval_mode"), mark_start, spans)
    if spans or moded:
        both = spans + moded
        sizes = batches + [np.nan] * len(moded)  # a pass found by the mode: batches unknown
        order = np.argsort([occ[0][0] for occ in both], kind="stable")
        out[EVALUATION] = _pieces(EVALUATION, [both[i] for i in order],
                                  batches=[sizes[i] for i in order])
    if len(mark_start) >= 2 and len(waits[0]) and trained.any():
        ids = waits[2][trained] & LOADER_ID_MASK
        values, counts = np.unique(ids, return_counts=True)
        train_loader = int(values[np.argmax(counts)])
        epochs = _epoch_starts(waits, trained, train_loader, iters, ends, claimed_iters)
        if epochs.count:
            out[EPOCH_START] = epochs
    if len(ckpt[0]):
        kinds, written = zip(*(checkpoint_key_parts(int(k)) for k in ckpt[2]), strict=True)
        out[CHECKPOINT] = _pieces(
            CHECKPOINT, [[(int(s), int(e))] for s, e in zip(ckpt[0], ckpt[1], strict=True)],
            bytes=[np.nan if b is None else float(b) for b in written],
            how=[float(k) for k in kinds])
    logged = run.intervals_of(proc, "logging")
    counted = _log_counts(run, proc)
    if len(logged[0]) or counted is not None:
        out[LOGGING] = _pieces(
            LOGGING, [[(int(s), int(e))] for s, e in zip(logged[0], logged[1], strict=True)],
            library=[float(k) for k in logged[2]])
    return RankPhases(r.rank, out, train_loader, counted)


def _log_counts(run: RunData, proc: tuple[int, int, int]) -> tuple[float, float, str] | None:
    """The process's logging calls as the probe counted them (None: none counted)."""
    row = run.rows("processes", proc)
    if row.empty or "log_calls" not in row or pd.isna(row["log_calls"].iloc[0]) or \
            pd.isna(row["log_s"].iloc[0]):
        return None
    return (float(row["log_calls"].iloc[0]), float(row["log_s"].iloc[0]),
            str(row["log_libraries"].iloc[0] or ""))


def _trained(t0: np.ndarray, t1: np.ndarray, mark_start: np.ndarray) -> np.ndarray:
    """Per batch: whether a backward() or optimizer step began after it, before the next."""
    if not len(t0):
        return np.zeros(0, dtype=bool)
    following = np.append(t0[1:], NEVER)
    return np.searchsorted(mark_start, following) > np.searchsorted(mark_start, t1)


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) index of each run of True in ``flags``."""
    idx = np.flatnonzero(flags)
    if not len(idx):
        return []
    cut = np.flatnonzero(np.diff(idx) != 1)
    firsts = np.concatenate(([idx[0]], idx[cut + 1]))
    lasts = np.concatenate((idx[cut], [idx[-1]]))
    return [(int(a), int(b)) for a, b in zip(firsts, lasts, strict=True)]


def _mode_passes(modes: tuple[np.ndarray, np.ndarray, np.ndarray], mark_start: np.ndarray,
                 found: list[list[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
    """The eval-mode stretches that are evaluation passes: no backward() or optimizer step
    began in them, and they hold no pass found from the batches (``found``)."""
    out = []
    for start, end in zip(modes[0], modes[1], strict=True):
        s, e = int(start), int(end)
        if e <= s or np.searchsorted(mark_start, e) > np.searchsorted(mark_start, s):
            continue
        if any(a < e and s < b for occ in found for a, b in occ):
            continue
        out.append([(s, e)])
    return out


def _evaluation(waits: tuple[np.ndarray, np.ndarray, np.ndarray], trained: np.ndarray,
                mark_start: np.ndarray, mark_end: np.ndarray, ckpt_start: np.ndarray,
                iters: tuple[np.ndarray, np.ndarray, np.ndarray],
                ends: tuple[np.ndarray, np.ndarray, np.ndarray]
                ) -> tuple[list[list[tuple[int, int]]], list[float], set[int]]:
    """The evaluation passes (their spans and batches), and the iterators (indices) that
    began them."""
    t0, t1, key = waits
    n = len(t0)
    no_grad = (key & LOADER_NO_GRAD) != 0
    runs = _runs(~trained)
    before = np.zeros(n)  # untrained batches just before each batch
    for first, last in runs:
        if last + 1 < n:
            before[last + 1] = last - first + 1
    usual = float(np.median(before[trained])) if trained.any() else 0.0
    starts_after = np.sort(np.concatenate([mark_start, ckpt_start]))
    spans: list[list[tuple[int, int]]] = []
    batches: list[float] = []
    claimed: set[int] = set()
    for first, last in runs:
        length = last - first + 1
        if length <= usual or (length < max(MIN_EVAL_BATCHES, 2 * usual + 2)
                               and not no_grad[first:last + 1].any()):
            continue
        start = int(t0[first])
        previous = max(int(t1[first - 1]) if first else 0, _last_before(mark_end, start))
        made = np.flatnonzero((iters[1] <= start) & (iters[0] >= previous))
        if len(made):
            claimed.add(int(made[-1]))
            start = int(iters[0][made[-1]])
        nxt = int(t0[last + 1]) if last + 1 < n else NEVER
        after = starts_after[np.searchsorted(starts_after, t1[last]):]
        end = min(nxt, int(after[0]) if len(after) else NEVER)
        if end == NEVER:  # nothing after it: to its loader's end, if recorded
            done = ends[1][ends[0] >= t1[last]]
            end = int(done[0]) if len(done) else int(t1[last])
        spans.append([(start, end)])
        batches.append(float(length))
    return spans, batches, claimed


def _last_before(sorted_ends: np.ndarray, t: int) -> int:
    i = int(np.searchsorted(sorted_ends, t, side="right"))
    return int(sorted_ends[i - 1]) if i else 0


def _epoch_starts(waits: tuple[np.ndarray, np.ndarray, np.ndarray], trained: np.ndarray,
                  loader: int, iters: tuple[np.ndarray, np.ndarray, np.ndarray],
                  ends: tuple[np.ndarray, np.ndarray, np.ndarray], claimed: set[int]
                  ) -> PhasePieces:
    """Each iterator of the training loader after its first batch (an evaluation pass's
    aside): the loader's end before it, the iterator made, and its first wait's excess."""
    t0, t1, key = waits
    mine = trained & ((key & LOADER_ID_MASK) == loader)
    if not mine.any():
        return _pieces(EPOCH_START, [])
    first_batch = int(t0[mine][0])
    usual_wait = float(np.median((t1 - t0)[mine]))
    train_t1 = t1[mine]
    spans: list[list[tuple[int, int]]] = []
    for j in range(len(iters[0])):
        s, e = int(iters[0][j]), int(iters[1][j])
        if j in claimed or s <= first_batch or (int(iters[2][j]) & LOADER_ID_MASK) != loader:
            continue
        last_trained = _last_before(train_t1, s)
        pieces = [(int(a), int(b)) for a, b, k in zip(*ends, strict=True)
                  if last_trained <= a and b <= s and (int(k) & LOADER_ID_MASK) == loader][-1:]
        pieces.append((s, e))
        nxt = int(np.searchsorted(t0, e))
        if nxt < len(t0) and (t1[nxt] - t0[nxt]) > usual_wait:
            pieces.append((int(t0[nxt] + usual_wait), int(t1[nxt])))
        spans.append(pieces)
    return _pieces(EPOCH_START, spans)


def log_library(code: float) -> str:
    """The library of a logging call (doctor.store.records.LOG_KINDS)."""
    i = int(code)
    return LOG_KINDS[i] if 0 <= i < len(LOG_KINDS) else "logging"


def checkpoint_kind(code: float) -> str:
    """The name of a checkpoint's kind of save (doctor.store.records.CHECKPOINT_KINDS)."""
    i = int(code)
    return CHECKPOINT_KINDS[i] if 0 <= i < len(CHECKPOINT_KINDS) else "save"


__all__ = ["CHECKPOINT", "EPOCH_START", "EVALUATION", "LABELS", "LOGGING", "PHASES", "TRAIN",
           "PhasePieces", "RankPhases", "checkpoint_kind", "find_phases", "log_library",
           "on_ledger"]
