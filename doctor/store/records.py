"""What the rings of a process folder hold: the record formats, and the codes in them.

The Session (doctor.record.session) writes these records; the reader (doctor.store.reader) turns
them into frames and the analysis reads the codes back.
"""

from __future__ import annotations

import math

# Step kinds in the ``steps`` ring, from the weakest evidence of a step boundary to the strongest.
STEP_DATALOADER = 0
STEP_BACKWARD = 1
STEP_OPTIMIZER = 2
STEP_MANUAL = 3
#: A CUDA graph replayed: outside the order above. A whole training step captured as one graph
#: replays with no optimizer step or backward() in Python; the replays are the steps once they
#: run on with no optimizer step between them (doctor.record.step_count.GRAPH_TAKEOVER).
STEP_GRAPH = 4
STEP_KIND_NAMES = {STEP_DATALOADER: "dataloader", STEP_BACKWARD: "backward",
                   STEP_OPTIMIZER: "optimizer", STEP_MANUAL: "manual", STEP_GRAPH: "graph"}

# Events in the ``events`` ring.
EVENT_WINDOW_START = 1
EVENT_WINDOW_STOP_BEGIN = 2
EVENT_WINDOW_STOP_END = 3

#: (struct format, field names) of each kind of ring.
STEPS_RECORD = ("<qii", ("t_ns", "kind", "key"))
INTERVAL_RECORD = ("<qqi", ("t0_ns", "t1_ns", "key"))
EVENT_RECORD = ("<qii", ("t_ns", "event", "value"))
#: The ``run_steps`` ring: a bucket of counted steps (doctor.record.run_steps): the first's start,
#: the last's end, the steps, the kind of boundary counted, the shortest and longest step (ns) and
#: when the longest ended.
RUN_STEPS_RECORD = ("<qqiiqqq", ("t0_ns", "t1_ns", "steps", "kind", "min_ns", "max_ns",
                                 "max_t_ns"))
#: Interval rings a process may hold (step hooks, the DataLoader probe, page faults around the
#: profiler window: doctor.probes.page_faults, the garbage collector's pauses: doctor.probes.gc,
#: checkpoints written: doctor.probes.checkpoints; ``logging``: logging calls of 1 ms or more,
#: doctor.probes.logging_calls; ``loader_iter``: a DataLoader iterator made
#: or reset, its epoch's start; ``loader_end``: the call that found the loader exhausted;
#: ``scale``: a GradScaler's scale as each update left it, ``nonfinite``: a backward() whose
#: loss was inf or NaN, both read late: see below; ``eval_mode``: from a ``model.eval()`` to the
#: next ``model.train()``, doctor.probes.eval_mode).
INTERVAL_RINGS = ("loader_wait", "backward", "optimizer", "fetch", "collate", "page_faults",
                  "gc", "graph_replay", "scaler", "compile", "checkpoint", "loader_iter",
                  "loader_end", "scale", "nonfinite", "logging", "eval_mode")
#: The probe whose records each ring holds: the one that stops when its ring cannot grow.
RING_PROBES = {"steps": "steps", "optimizer": "steps", "run_steps": "steps", "backward": "steps",
               "graph_replay": "steps", "scaler": "steps", "scale": "steps",
               "nonfinite": "steps", "eval_mode": "steps",
               "loader_wait": "dataloader", "fetch": "dataloader", "collate": "dataloader",
               "loader_iter": "dataloader", "loader_end": "dataloader",
               "checkpoint": "checkpoints", "logging": "logging",
               "events": "torch_ops",
               "page_faults": "page_faults", "gc": "gc", "compile": "compile"}


# The ``gc`` ring's key: a collection's generation (0-2) in its low bits, the objects it
# collected above them (at most GC_COLLECTED_MAX: an interval's key is an int32).
GC_GENERATION_BITS = 2
GC_COLLECTED_MAX = (2**31 - 1) >> GC_GENERATION_BITS


def gc_key(generation: int, collected: int) -> int:
    """The ``gc`` ring's key of a collection of ``generation`` that collected ``collected``."""
    return (min(max(collected, 0), GC_COLLECTED_MAX) << GC_GENERATION_BITS) | (generation & 3)


def gc_key_parts(key: int) -> tuple[int, int]:
    """(generation, objects collected) of a ``gc`` ring's key."""
    return key & 3, key >> GC_GENERATION_BITS


# The ``compile`` ring's key (probes/compile.py): for a compilation of a frame by TorchDynamo,
# the frame's number and which compilation of it this is (0 the first, then recompilations);
# for a compilation Dynamo deferred (a backward compiled lazily, a CUDA graph recorded at run
# time), minus its trigger's number (CallbackTrigger).
DYNAMO = 1
COMPILES_PER_FRAME = 1000  # recompilations of a frame beyond 999 are counted as the 999th


def compile_key(frame: int, nth: int) -> int:
    return min(frame, 2_000_000) * COMPILES_PER_FRAME + min(nth, COMPILES_PER_FRAME - 1)


def compile_frame(key: int) -> tuple[int, int]:
    """(frame, nth) of a Dynamo compilation's key (``compile_key``)."""
    return key // COMPILES_PER_FRAME, key % COMPILES_PER_FRAME


# The ``loader_wait`` ring's key: the loader's id (doctor.record.session.Session.record_loader)
# in its low bits, and LOADER_NO_GRAD where the batch was asked for with autograd off
# (torch.no_grad(), torch.inference_mode()): an evaluation loop's batches, most often.
LOADER_ID_MASK = (1 << 20) - 1
LOADER_NO_GRAD = 1 << 20


def loader_key(loader_id: int, grad: bool = True) -> int:
    """The ``loader_wait`` ring's key of a batch of loader ``loader_id`` (-1: unknown)."""
    return (loader_id & LOADER_ID_MASK) | (0 if grad else LOADER_NO_GRAD)


# The ``logging`` ring's key (doctor.probes.logging_calls): the library of a logging call.
LOG_KINDS = ("logging", "tensorboard", "wandb", "mlflow")

# The ``checkpoint`` ring's key: how it was written (CHECKPOINT_KINDS) in its low bits, and
# above them the KiB written plus one (0: not known, a file object that cannot tell).
CHECKPOINT_KINDS = ("torch.save", "safetensors", "torch.distributed.checkpoint",
                    "torch.distributed.checkpoint.async_save")
CHECKPOINT_KIND_BITS = 2
CHECKPOINT_KIB_MAX = (2**31 - 1) >> CHECKPOINT_KIND_BITS


def checkpoint_key(kind: int, written: int | None) -> int:
    """The ``checkpoint`` ring's key of a save of ``kind`` that wrote ``written`` bytes."""
    kib = 0 if written is None or written < 0 else min(-(-written // 1024) + 1,
                                                        CHECKPOINT_KIB_MAX)
    return (kib << CHECKPOINT_KIND_BITS) | (kind & 3)


def checkpoint_key_parts(key: int) -> tuple[int, int | None]:
    """(kind, bytes written or None where not known) of a ``checkpoint`` ring's key (bytes to
    the KiB)."""
    kib = key >> CHECKPOINT_KIND_BITS
    return key & 3, None if kib <= 0 else (kib - 1) * 1024


# The ``scale`` ring (probes/steps.py): a GradScaler's scale from the interval's start on (the
# end of the update() that set it; the first update's start for the scale it began with), its
# key the scale's log2 in 1/SCALE_STEPS of an octave (0.3 % apart); a scale of 0 or one not
# finite has a key of its own. Read late on a GPU (doctor.record.late_reads): the interval ends
# when it was read.
SCALE_STEPS = 256
SCALE_ZERO, SCALE_NOT_FINITE = -(2**31), 2**31 - 1
_SCALE_KEY_MAX = 2**31 - 2


def scale_key(scale: float) -> int:
    """The ``scale`` ring's key of ``scale``."""
    if not math.isfinite(scale):
        return SCALE_NOT_FINITE
    if scale <= 0:
        return SCALE_ZERO
    return max(-_SCALE_KEY_MAX, min(_SCALE_KEY_MAX, round(math.log2(scale) * SCALE_STEPS)))


def scale_of_key(key: int) -> float:
    """The scale a ``scale`` ring's key stands for (inf: not finite)."""
    if key == SCALE_NOT_FINITE:
        return float("inf")
    if key == SCALE_ZERO:
        return 0.0
    return float(2.0 ** (key / SCALE_STEPS))


# The ``nonfinite`` ring's key: what the loss of the backward() in the interval was.
LOSS_INF, LOSS_NAN = 1, 2
