"""Mixed precision as the job runs it, for the steps probe (probes/steps.py): which autocast
(device, dtype) it enters, each GradScaler's settings as it first updates, the scale after every
update, and every backward() whose loss was inf or NaN.

Costs a step: a set lookup per ``autocast.__enter__``; per update, on a CPU, one ``item()`` of
the scale (0.2 us), on a GPU one non-blocking copy read a step late (doctor.record.late_reads),
and a record only where the scale changed;
per backward() of a one-element loss, the same. Nothing here waits for the GPU or raises into
the job: a failure stops that reading and says so once in the probe's status.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..record.late_reads import LateReads
from ..record.patches import Patches
from ..record.session import Session
from ..store.records import LOSS_INF, LOSS_NAN, scale_key

SCALER_SETTINGS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


class AmpWatch:
    """What the steps probe calls: ``wrap_autocast`` once, ``updating``/``updated`` around each
    GradScaler update, ``backward_ended`` after each backward()."""

    def __init__(self, session: Session, torch: Any) -> None:
        self.session = session
        self._torch = torch
        self._casts: set[tuple[Any, Any, Any]] = set()
        self.autocasts: list[dict[str, Any]] = []  # each (device, dtype, enabled) as first seen
        self.scalers: list[dict[str, Any]] = []  # each scaler's settings as it first updated
        self._scales_seen: dict[int, float] = {}  # scaler id -> the last scale recorded
        self._scales = LateReads(torch)
        self._losses = LateReads(torch)
        self.scale_fell: Callable[[], None] | None = None  # told where a scale read lower

    # ----- autocast -------------------------------------------------------------------------
    def wrap_autocast(self, patches: Patches) -> None:
        """``torch.autocast.__enter__`` (the class torch.cuda.amp and torch.cpu.amp's derive
        from) noting each distinct (device, dtype, enabled) the job enters."""
        cls = getattr(getattr(getattr(self._torch, "amp", None), "autocast_mode", None),
                      "autocast", None)
        orig = getattr(cls, "__enter__", None)
        if orig is None:
            return
        seen, saw = self._casts, self._saw_autocast

        def __enter__(ctx: Any) -> Any:
            try:
                key = (ctx.device, ctx.fast_dtype, ctx._enabled)
                if key not in seen:
                    saw(key)
            except Exception:  # an autocast of another torch's shape: not recorded
                pass
            return orig(ctx)

        __enter__.__wrapped__ = orig  # type: ignore[attr-defined]
        patches.put(cls, "__enter__", __enter__)

    def _saw_autocast(self, key: tuple[Any, Any, Any]) -> None:
        self._casts.add(key)
        device, dtype, enabled = key
        self.autocasts.append({"device": str(device), "enabled": bool(enabled),
                               "dtype": str(dtype).removeprefix("torch.")})
        self.session.update_meta(autocast=self.autocasts)

    # ----- GradScaler -----------------------------------------------------------------------
    def updating(self, scaler: Any, t0: int) -> None:
        """Before a GradScaler update that began at ``t0``: its settings and the scale it began
        with, the first time this scaler updates."""
        if id(scaler) in self._scales_seen:
            return
        try:
            self._scales_seen[id(scaler)] = float("nan")
            facts = {"class": type(scaler).__name__,
                     "device": str(getattr(scaler, "_device", "")),
                     "enabled": bool(scaler.is_enabled())}
            for name in SCALER_SETTINGS:
                value = getattr(scaler, f"_{name}", None)
                if isinstance(value, int | float):
                    facts[name] = value
            self.scalers.append(facts)
            self.session.update_meta(scalers=self.scalers)
            scale = getattr(scaler, "_scale", None)
            begun = scale.item() if scale is not None and scale.is_cpu else facts.get(
                "init_scale")
            if isinstance(begun, int | float):
                self._scale_read(id(scaler), t0, float(begun))
        except Exception as err:  # a scaler of another shape: its scale is not followed
            self.session.swallowed("steps", "reading a GradScaler's settings", err)

    def updated(self, scaler: Any, t1: int) -> None:
        """After a GradScaler update that ended at ``t1``: its scale, now or a step late."""
        scale = getattr(scaler, "_scale", None)
        ready = self._scales.ready() if scale is None else self._scales.put(scale, (id(scaler),
                                                                                     t1))
        for (who, t), value in ready:
            self._scale_read(who, t, value)

    def _scale_read(self, who: int, t: int, value: float) -> None:
        """Scaler ``who``'s scale from ``t`` on, recorded where it changed (a scale that
        stays keeps the ring for the changes: doctor.analyse.scaler carries it forward)."""
        last = self._scales_seen.get(who)
        if value != last:
            self._scales_seen[who] = value
            if self.scale_fell is not None and last is not None and value < last:
                self.scale_fell()
            self.session.record_interval("scale", t, self.session.clock(), scale_key(value))

    # ----- losses ---------------------------------------------------------------------------
    def backward_ended(self, loss: Any, t0: int, t1: int) -> None:
        """After a backward() of ``loss`` from ``t0`` to ``t1``: each loss read since that was
        inf or NaN recorded over its backward()."""
        try:
            one = loss.numel() == 1
        except Exception:  # a sequence of tensors, a tensor of another library
            return
        ready = self._losses.put(loss, (t0, t1)) if one else self._losses.ready()
        for (b0, b1), value in ready:
            if not math.isfinite(value):
                self.session.record_interval("nonfinite", b0, b1,
                                             LOSS_NAN if value != value else LOSS_INF)

    def stop(self) -> None:
        """What is still in flight, once it has landed (waited for briefly: doctor.record.
        late_reads.FINAL_WAIT_S)."""
        for (b0, b1), value in self._losses.final():
            if not math.isfinite(value):
                self.session.record_interval("nonfinite", b0, b1,
                                             LOSS_NAN if value != value else LOSS_INF)
        for (who, t), value in self._scales.final():
            self._scale_read(who, t, value)
