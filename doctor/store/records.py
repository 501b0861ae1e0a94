"""What the rings of a process folder hold: the record formats, and the codes in them.

The Session (doctor.record.session) writes these records; the reader (doctor.store.reader) turns
them into frames and the analysis reads the codes back.
"""

from __future__ import annotations

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
#: Interval rings a process may hold (step hooks, the DataLoader probe, page faults around the
#: profiler window: doctor.probes.page_faults, the garbage collector's pauses: doctor.probes.gc).
INTERVAL_RINGS = ("loader_wait", "backward", "optimizer", "fetch", "collate", "page_faults",
                  "gc", "graph_replay", "scaler", "compile")
#: The probe whose records each ring holds: the one that stops when its ring cannot grow.
RING_PROBES = {"steps": "steps", "optimizer": "steps", "backward": "steps",
               "graph_replay": "steps", "scaler": "steps",
               "loader_wait": "dataloader", "fetch": "dataloader", "collate": "dataloader",
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
