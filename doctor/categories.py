"""The categories of step time: the one list that every stage, rule and report uses.

The ledger splits each step's wall time into ``CATEGORIES``; the verdict names one of
``BOTTLENECKS``. Input time is one pipeline of ``INPUT_STAGES``; where it cannot be split by stage
(a trace on its own, or no stack samples), it stays whole as ``UNSPLIT_INPUT``. The torch.profiler
window splits the rest of a step into ``NON_INPUT``; a trace alone tells ``TRACE_CATEGORIES``
apart.
"""

from __future__ import annotations

INPUT_STAGES: tuple[str, ...] = ("io", "decode", "preprocess")
#: Input wait measured but not split by stage.
UNSPLIT_INPUT = "input"
#: Everything the input pipeline is made of, split or not.
INPUT_PIPELINE: tuple[str, ...] = (*INPUT_STAGES, UNSPLIT_INPUT)
#: The six bottleneck categories, in the order reports show them.
BOTTLENECKS: tuple[str, ...] = (*INPUT_STAGES, "transfer", "compute", "communication")
#: Every column of the step ledger that holds time: the six categories plus ``other``.
CATEGORIES: tuple[str, ...] = (*BOTTLENECKS, "other")
#: What the profiler window splits the time outside the input wait into.
NON_INPUT: tuple[str, ...] = ("transfer", "compute", "communication", "other")
#: What a trace on its own can tell apart (it has no view of the loading code).
TRACE_CATEGORIES: tuple[str, ...] = (UNSPLIT_INPUT, *NON_INPUT)
