"""Which step boundaries count, in the job: the Session's step count, that the deep window and
the other step listeners follow.

Only the strongest kind of boundary seen so far counts (a DataLoader batch, then ``backward()``,
then an optimizer step, then ``doctor.step()``): a job that steps an optimizer is counted by its
optimizer steps from the first one on. CUDA graph replays stand outside that order: a training
step captured whole as one graph replays with no optimizer step or ``backward()`` in Python, so
the replays count once GRAPH_TAKEOVER of them ran with nothing stronger between them, until
such a step comes back.
"""

from __future__ import annotations

from ..store.records import STEP_BACKWARD, STEP_GRAPH

#: CUDA graph replays in a row, with no backward(), optimizer or manual step between, after
#: which the replays are the steps: more than any gradient accumulation of captured parts runs.
GRAPH_TAKEOVER = 64


class StepCounter:
    """The count of the kind of step boundary that counts (see the module docstring)."""

    def __init__(self) -> None:
        self.kind = -1
        self.key = 0
        self.count = 0
        self.replays_in_a_row = 0  # CUDA graph replays since the last stronger boundary

    def saw(self, kind: int, key: int = 0) -> int | None:
        """A boundary of ``kind`` (from optimizer ``key``): the new count when it counts."""
        if kind == STEP_GRAPH:
            self.replays_in_a_row += 1
            if self.kind != STEP_GRAPH:
                if self.kind >= 0 and self.replays_in_a_row < GRAPH_TAKEOVER:
                    return None
                self._restart(STEP_GRAPH, 0)
        else:
            if kind >= STEP_BACKWARD:
                self.replays_in_a_row = 0
            if self.kind == STEP_GRAPH and kind < STEP_BACKWARD:
                return None  # a DataLoader batch beside a graph that is the whole step
            if kind > self.kind or self.kind == STEP_GRAPH:
                self._restart(kind, key)  # a stronger kind appeared: count those from now on
            elif kind < self.kind or key != self.key:
                return None
        self.count += 1
        return self.count

    def _restart(self, kind: int, key: int) -> None:
        self.kind, self.key, self.count = kind, key, 0
