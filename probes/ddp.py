"""DDP probe: the settings and gradient buckets of each DistributedDataParallel the job builds,
for the communication model (doctor.analyse.comm_model).

At start it wraps ``DistributedDataParallel.__init__`` to keep a weak reference to each
instance (nothing runs per step). When the profiler window ends (steady state: DDP has rebuilt
its buckets in the order gradients arrive) and at exit, it records, per instance (the first
``MAX_MODULES``):

- the settings: ``bucket_cap_bytes``, ``gradient_as_bucket_view``, ``static_graph``,
  ``find_unused_parameters``;
- from the reducer's own logging data (``_get_ddp_logging_data()``, where this torch has it):
  the buckets' sizes in bytes, the gradients' dtypes, the parameters' bytes, the backend, the
  world size, and DDP's own averages of backward compute, backward communication and their
  overlap (nanoseconds, over the iterations the reducer sampled).

Runs inside the job, twice a run at most; a failure records nothing and never stops the job.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from ..record.session import CLOSE, WINDOW_END, Session
from ..verdict import ProbeStatus

MAX_MODULES = 4
#: From the reducer's logging data: the keys kept, as this probe names them.
LOGGED = {
    "bucket_sizes": "bucket_bytes", "dtypes": "dtypes",
    "total_parameter_size_bytes": "parameter_bytes", "backend_name": "backend",
    "world_size": "world_size", "avg_backward_compute_time": "backward_compute_ns",
    "avg_backward_comm_time": "backward_comm_ns",
    "avg_backward_compute_comm_overlap_time": "backward_overlap_ns",
    "has_rebuilt_buckets": "rebuilt_buckets", "iteration": "iteration",
}


class DdpProbe:
    name = "ddp"

    def __init__(self, session: Session) -> None:
        self.session = session
        self._modules: list[weakref.ref[Any]] = []
        self._restore: tuple[Any, Any] | None = None
        self._recorded = False

    def check(self) -> ProbeStatus:
        try:
            import torch.distributed as dist

            if not dist.is_available():
                return ProbeStatus(False, "this torch is built without torch.distributed", "")
        except ImportError as err:
            return ProbeStatus(False, f"torch.distributed is not importable ({err})", "")
        return ProbeStatus(True)

    def start(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        orig = DistributedDataParallel.__init__
        modules = self._modules

        @functools.wraps(orig)
        def __init__(this: Any, *args: Any, **kwargs: Any) -> None:
            orig(this, *args, **kwargs)
            if len(modules) < MAX_MODULES:
                modules.append(weakref.ref(this))

        self._restore = (DistributedDataParallel, orig)
        setattr(DistributedDataParallel, "__init__", __init__)  # noqa: B010
        self.session.on(WINDOW_END, self.record)
        self.session.on(CLOSE, lambda: self.record(at_exit=True))

    def sample(self) -> None:
        pass  # event-driven

    def stop(self) -> None:
        if self._restore is not None:
            cls, orig = self._restore
            setattr(cls, "__init__", orig)  # noqa: B010
            self._restore = None

    def record(self, at_exit: bool = False) -> None:
        if (at_exit and self._recorded) or not self.session.recording:
            return
        try:
            rows = [ddp_settings(m) for ref in self._modules if (m := ref()) is not None]
            if rows:
                self.session.update_meta(ddp=rows)
                self._recorded = True
        except Exception as err:  # evidence, never a reason to fail the job
            self.session.swallowed(self.name, "reading DistributedDataParallel's settings", err)


def ddp_settings(module: Any) -> dict[str, Any]:
    """What one DistributedDataParallel is set to, and its buckets (see the module docstring)."""
    out: dict[str, Any] = {
        "bucket_cap_bytes": _int(getattr(module, "bucket_bytes_cap", None)),
        "gradient_as_bucket_view": bool(getattr(module, "gradient_as_bucket_view", False)),
        "static_graph": bool(getattr(module, "static_graph", False)),
        "find_unused_parameters": bool(getattr(module, "find_unused_parameters", False)),
    }
    logged = getattr(module, "_get_ddp_logging_data", None)
    data = logged() if callable(logged) else {}
    for key, name in LOGGED.items():
        if key in data:
            out[name] = data[key]
    sizes = out.get("bucket_bytes")
    if isinstance(sizes, str):
        out["bucket_bytes"] = [int(s) for s in sizes.replace(",", " ").split() if s.isdigit()]
    if isinstance(out.get("dtypes"), str):
        out["dtypes"] = [d.strip() for d in out["dtypes"].split(",") if d.strip()]
    return out


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
