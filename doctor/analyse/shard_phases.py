"""A sharded job's collectives phase by phase (issue 36, item 2): the all-gathers before each
unit's forward, those before its backward (again, where units reshard after forward), and the
reduce-scatters of its gradients after; per phase and per unit, their calls, bytes, time, the
part no compute overlapped (exposed) and the part it did (overlapped), the bus bandwidth
(nccl-tests' factor: (n-1)/n of the gathered output, or of the scattered input) against the
link, and for the all-gathers whether prefetching worked:

- ``worked``: most of the phase's all-gather time ran beside compute (the next unit gathered
  while this one computed: FSDP2's implicit prefetch on a GPU, or explicit prefetch);
- ``issued ahead, not overlapped``: FSDP's prefetch hooks issued most of them ahead of their
  unit, yet most of their time is exposed (a collective that blocks its thread: gloo with
  FSDP2's synchronous unshard; or too little compute to hide them);
- ``none``: each unit gathered on demand, in its own hook, with nothing beside it.

``hook_s`` is the time FSDP's hooks around a phase's collectives held the thread that issued
them (FSDP2's ``FSDP::pre_forward (unit)``...: copying the shards in and the gathered
parameters out, dividing the gradients, waiting), each hook shared by the collectives issued
inside it (doctor.trace.comm_context.units): what the training thread lost to the phase.

``hideable_s`` bounds what prefetching one unit ahead can hide: per all-gather, the lesser of
its exposed time and the compute it could have run beside (doctor.trace.comm_calls): issued on
demand, the compute between the previous all-gather of its phase and its start
(``compute_before_s``); issued ahead already (blocking its thread), the compute between its
end and the next all-gather's start (``compute_after_s``). The last all-gather of a phase
issued ahead counts none: a floor.

Units are told apart by the unit FSDP2's annotations name; where none is named (FSDP1, a trace
without host annotations, DeepSpeed), by their order in each step (``#1``, ``#2``...) where every
step issues the same count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import pandas as pd

from doctor.analyse.comms import Link, RankComms
from doctor.analyse.parallelism import SHARDED

FORWARD_GATHERS = "forward all-gathers"
BACKWARD_GATHERS = "backward all-gathers"
REDUCE_SCATTERS = "reduce-scatters"
PHASES = (FORWARD_GATHERS, BACKWARD_GATHERS, REDUCE_SCATTERS)
WORKED, AHEAD, NONE = "worked", "issued ahead, not overlapped", "none"
#: A phase whose all-gathers ran this share of their time beside compute: prefetch worked.
OVERLAPPED_WORKED = 0.5
#: A phase whose all-gathers a prefetch hook issued this share of: issued ahead.
PREFETCHED_AHEAD = 0.5


def phase_of(kind: str, phase: str) -> str:
    """The sharded phase of a collective of ``kind`` issued in the step's ``phase`` ("":
    none of them: an all-gather in the optimizer's step, a sharded all-reduce)."""
    if kind == "allgather":
        return {"forward": FORWARD_GATHERS, "backward": BACKWARD_GATHERS}.get(phase, "")
    return REDUCE_SCATTERS if kind == "reducescatter" else ""


@dataclass(frozen=True)
class PhaseCost:
    """One phase's collectives on one rank, a step of its window."""

    phase: str
    calls: float
    bytes: float  # nan: not known
    seconds: float
    exposed_s: float
    hideable_s: float  # what prefetching one unit ahead could hide (module docstring)
    bus_gb_per_s: float  # median; nan: not known
    of_link: float  # the bus bandwidth's share of the link's; nan: the link is not known
    prefetched: float  # the share of its calls a prefetch hook issued
    prefetch: str  # WORKED, AHEAD, NONE; "" for reduce-scatters
    hook_s: float = 0.0  # the time FSDP's hooks around them held the issuing thread (copies in
    # and out, waits): what the thread lost to the phase, the collectives' own time included

    @property
    def overlapped_s(self) -> float:
        return max(self.seconds - self.exposed_s, 0.0)

    @property
    def overlapped_share(self) -> float:
        return self.overlapped_s / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class UnitCost:
    """One unit's collectives of one phase on one rank, a step."""

    phase: str
    unit: str
    calls: float
    bytes: float
    seconds: float
    exposed_s: float
    bus_gb_per_s: float
    prefetched: float


@dataclass(frozen=True)
class ShardPhases:
    """A rank's sharded collectives by phase and by unit (the module docstring)."""

    rank: int
    steps: int
    link: Link | None
    phases: tuple[PhaseCost, ...]
    units: tuple[UnitCost, ...]

    def of(self, phase: str) -> PhaseCost | None:
        return next((p for p in self.phases if p.phase == phase), None)

    @property
    def exposed_s(self) -> float:
        return sum(p.exposed_s for p in self.phases)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    def table(self) -> pd.DataFrame:
        """The report's rows: each phase, then its units."""
        rows = []
        for p in self.phases:
            rows.append({"rank": self.rank, "phase": p.phase, "unit": "(all)", "calls": p.calls,
                         "bytes": p.bytes, "time_s": p.seconds, "exposed_s": p.exposed_s,
                         "overlapped_s": p.overlapped_s, "hook_s": p.hook_s,
                         "bus_gb_per_s": p.bus_gb_per_s,
                         "link_share": p.of_link, "prefetch": p.prefetch})
            rows += [{"rank": self.rank, "phase": p.phase, "unit": u.unit, "calls": u.calls,
                      "bytes": u.bytes, "time_s": u.seconds, "exposed_s": u.exposed_s,
                      "overlapped_s": max(u.seconds - u.exposed_s, 0.0), "hook_s": float("nan"),
                      "bus_gb_per_s": u.bus_gb_per_s, "link_share": float("nan"),
                      "prefetch": "ahead" if u.prefetched >= PREFETCHED_AHEAD else ""}
                     for u in self.units if u.phase == p.phase]
        return pd.DataFrame(rows)

    def to_dict(self, units: bool = True) -> dict[str, object]:
        """verdict.json's entry (a step's figures; nan left out); ``units``: with each unit's
        (the section's), not only each phase's (a finding's evidence)."""
        def clean(d: dict[str, object]) -> dict[str, object]:
            return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in d.items()
                    if not (isinstance(v, float) and math.isnan(v))}

        return {"rank": self.rank, "steps": self.steps,
                "link": {"name": self.link.name, "gb_per_s": self.link.shown_gb_per_s}
                if self.link else None,
                "phases": [clean({**asdict(p), "overlapped_s": p.overlapped_s})
                           for p in self.phases],
                **({"units": [clean(asdict(u)) for u in self.units]} if units else {})}


def rank_phases(calls: pd.DataFrame, steps: int, rank: int = 0, link: Link | None = None
                ) -> ShardPhases | None:
    """One rank's sharded collectives (rows of ``calls`` with the ``sharded`` role) by phase
    and unit, a step of its ``steps`` window steps (None: none, or no step)."""
    if calls.empty or "role" not in calls or steps <= 0:
        return None
    mine = calls[calls["role"] == SHARDED]
    phase = [phase_of(str(k), str(p)) for k, p in
             zip(mine["kind"], mine["phase"] if "phase" in mine else [""] * len(mine),
                 strict=True)]
    mine = mine.assign(sharded_phase=phase)
    mine = mine[mine["sharded_phase"] != ""].sort_values("start_us", kind="stable")
    if mine.empty:
        return None
    for col, default in (("prefetched", False), ("compute_before_s", 0.0),
                         ("compute_after_s", 0.0), ("hook_s", 0.0), ("unit", "")):
        if col not in mine:
            mine = mine.assign(**{col: default})
    mine = mine.assign(prefetched=mine["prefetched"].fillna(False).astype(bool),
                       compute_before_s=mine["compute_before_s"].fillna(0.0),
                       compute_after_s=mine["compute_after_s"].fillna(0.0),
                       unit=_units(mine, steps))
    out, units = [], []
    for name in PHASES:
        part = mine[mine["sharded_phase"] == name]
        if part.empty:
            continue
        out.append(_phase_cost(name, part, steps, link))
        for unit, of_unit in part.groupby("unit", sort=False):
            units.append(UnitCost(name, str(unit), len(of_unit) / steps,
                                  float(of_unit["bytes"].sum(min_count=1)) / steps,
                                  float(of_unit["seconds"].sum()) / steps,
                                  float(of_unit["exposed_s"].sum()) / steps,
                                  _median_gb(of_unit), float(of_unit["prefetched"].mean())))
    return ShardPhases(rank, steps, link, tuple(out), tuple(units))


def _phase_cost(name: str, part: pd.DataFrame, steps: int, link: Link | None) -> PhaseCost:
    exposed = part["exposed_s"].astype(float)
    beside = part["compute_after_s"].where(part["prefetched"], part["compute_before_s"])
    hideable = exposed.clip(upper=beside.astype(float).clip(lower=0.0))
    seconds = float(part["seconds"].sum())
    prefetched = float(part["prefetched"].mean())
    state = ""
    if name != REDUCE_SCATTERS:
        overlapped = 1.0 - float(exposed.sum()) / seconds if seconds > 0 else 0.0
        state = WORKED if overlapped >= OVERLAPPED_WORKED else \
            AHEAD if prefetched >= PREFETCHED_AHEAD else NONE
    bus = _median_gb(part)
    return PhaseCost(name, len(part) / steps, float(part["bytes"].sum(min_count=1)) / steps,
                     seconds / steps, float(exposed.sum()) / steps,
                     float(hideable.sum()) / steps, bus,
                     bus / link.gb_per_s if link is not None and link.gb_per_s > 0
                     else float("nan"), prefetched, state,
                     float(part["hook_s"].fillna(0.0).sum()) / steps)


def _median_gb(part: pd.DataFrame) -> float:
    bus = part["bus_bytes_s"].astype(float) if "bus_bytes_s" in part else pd.Series(dtype=float)
    return float(bus.median()) / 1e9 if bus.notna().any() else float("nan")


def _units(calls: pd.DataFrame, steps: int) -> pd.Series:
    """Each call's unit: the one FSDP2 named; else its place among its phase's calls of a step
    (``#1``...), where every step of the window issues the same count; else ""."""
    named = calls["unit"].fillna("").astype(str)
    out = named.copy()
    for _, part in calls[named == ""].groupby("sharded_phase", sort=False):
        if len(part) % steps == 0:
            per_step = len(part) // steps
            out.loc[part.index] = pd.Series(
                [f"#{i % per_step + 1}" for i in range(len(part))], index=part.index)
    return out


def shard_phases(comms: Mapping[int, RankComms] | None) -> dict[int, ShardPhases]:
    """Every rank's sharded collectives by phase (ranks without any left out)."""
    out = {}
    for rank, c in (comms or {}).items():
        found = rank_phases(c.calls, c.steps, rank, c.link)
        if found is not None:
            out[rank] = found
    return out


def shard_table(phases: Mapping[int, ShardPhases]) -> dict[str, pd.DataFrame]:
    """The report's table (none without sharded collectives): every rank's phases and units."""
    parts = [p.table() for _, p in sorted(phases.items())]
    return {"sharded_phases": pd.concat(parts, ignore_index=True)} if parts else {}


def critical_phases(phases: Mapping[int, ShardPhases] | None) -> ShardPhases | None:
    """The rank whose sharded collectives are most exposed (the lowest of equals)."""
    if not phases:
        return None
    return max(phases.values(), key=lambda p: (p.exposed_s, -p.rank))
