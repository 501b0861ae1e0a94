"""Where each rank's gradients overflowed, as the overflow watch read it
(doctor.probes.overflow_watch): in the skipped iterations it watched, the module of the first
gradient (in backward order) that was inf or NaN, the one named first most often, with how many
of the skipped iterations read named it, and how many iterations were watched in all; or why the
watch was not armed. Nothing here decides anything: doctor.rules.iterations reads it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from doctor.analyse.steps import RankSteps
from doctor.store.rundata import RunData


@dataclass(frozen=True)
class Overflow:
    """One rank's overflow, where it was found."""

    rank: int
    module: str  # the module path ("" where the parameter is the model's own, or unnamed)
    module_class: str
    param: str  # the parameter's name in its module ("weight"), or "#i" where no module named it
    shape: str  # "64x8"
    first_in: int  # skipped iterations read whose first non-finite gradient was in it
    read: int  # skipped iterations read
    watched: int  # iterations watched (every period)
    nonfinite: int  # non-finite gradients in the first such iteration ...
    params: int  # ... of those flagged
    then: str  # the modules that followed in backward order, comma-separated
    forward: str = ""  # the module whose output was first inf/NaN, most often ("": none seen)
    forward_class: str = ""
    forward_in: int = 0  # skipped iterations read that named it

    @property
    def forward_where(self) -> str:
        """The forward's layer as words: "mid (Linear)", "the model" for the outermost."""
        name = self.forward or "the model"
        return f"{name} ({self.forward_class})" if self.forward_class else name

    @property
    def where(self) -> str:
        """The layer as the words of a finding: "encoder.2 (Linear)"; a parameter no module
        named: "parameter #3 (16x16)"."""
        if self.module:
            return f"{self.module} ({self.module_class})" if self.module_class else self.module
        if not self.param:
            return "a parameter doctor could not name"
        if self.param.startswith("#"):
            return f"parameter {self.param} ({self.shape})"
        return f"the model's own {self.param} ({self.module_class or self.shape})"


@dataclass(frozen=True)
class NotFound:
    """Why a rank's overflow was not found: the watch was not armed, or read none."""

    rank: int
    reason: str


def overflows(run: RunData, ranks: Mapping[int, RankSteps]) -> dict[int, Overflow | NotFound]:
    """Per rank whose overflow watch was armed or said why it was not, what it found."""
    out: dict[int, Overflow | NotFound] = {}
    for rank, r in ranks.items():
        rows = run.rows("overflows", r.process)
        if rows.empty:
            continue
        notes = rows[rows["kind"] == "not_armed"]
        periods = rows[rows["kind"] == "period"]
        read = rows[rows["kind"] == "iteration"].sort_values("iteration", kind="stable")
        if read.empty:
            reason = str(notes["note"].iloc[0]) if len(notes) else \
                f"no skipped iteration read in {int(periods['watched'].sum())} watched"
            out[rank] = NotFound(rank, reason)
            continue
        keys = list(zip(read["module"], read["param"], strict=True))
        (module, param), count = Counter(keys).most_common(1)[0]
        first = read.iloc[keys.index((module, param))]
        seen = read[read["forward_class"] != ""]
        outputs = list(zip(seen["forward"], seen["forward_class"], strict=True))
        (forward, forward_class), forward_in = Counter(outputs).most_common(1)[0] \
            if outputs else (("", ""), 0)
        out[rank] = Overflow(
            rank=rank, module=str(module), module_class=str(first["module_class"]),
            param=str(param), shape=str(first["shape"]), first_in=int(count), read=len(read),
            watched=int(periods["watched"].sum()), nonfinite=int(first["nonfinite"]),
            params=int(first["params"]), then=str(first["then"]), forward=str(forward),
            forward_class=str(forward_class), forward_in=int(forward_in))
    return out
