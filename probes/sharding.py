"""Sharding probe: the sharded data-parallel modules the job builds, for the analysis of their
collectives (doctor.analyse.parallelism).

Once the job imports ``torch.distributed.fsdp`` it wraps FSDP2's ``fully_shard`` (where that
module exports it) and FSDP1's ``FullyShardedDataParallel.__init__``: each call is counted, with
its settings (FSDP2: ``reshard_after_forward``, the mesh's size, the bytes of the parameters the
call shards, those not yet sharded by an inner call; FSDP1: ``sharding_strategy``,
``forward_prefetch``, ``backward_prefetch``, ``limit_all_gathers``). Once it imports
``torch.distributed.optim``, the ZeRO-1 optimizer ``ZeroRedundancyOptimizer`` is wrapped the
same way (its optimizer class, ``parameters_as_bucket_view``, ``overlap_with_ddp``). Once it
imports ``deepspeed.runtime.engine``, ``DeepSpeedEngine.__init__`` is wrapped: each engine built
is counted, and the first one's ZeRO stage and communication settings are read from it after its
construction (doctor.probes.deepspeed_config). Once it imports
``torch.distributed.tensor.parallel``, ``parallelize_module`` is wrapped: the modules each call
parallelises (``units``), their styles (``ColwiseParallel 6, RowwiseParallel 6``) and the
tensor-parallel mesh's size. Nothing runs per step; the totals go to meta.json (``sharding``)
when the profiler window ends and at exit.

Runs inside the job at construction time only; a failure records nothing and never stops the
job (the wrapped call's own result and errors pass through untouched).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from ..record.parallel_overrides import FULLY_SHARD_AT
from ..record.session import Session
from .deepspeed_config import engine_config
from .on_import import OnImportProbe

MAX_UNITS_KEPT = 64  # units whose bytes are kept one by one (the count is always whole)
ZERO_API = "ZeroRedundancyOptimizer"
ZERO_SETTINGS = ("parameters_as_bucket_view", "overlap_with_ddp")
DEEPSPEED_MODULE = "deepspeed.runtime.engine"
TP_MODULES = ("torch.distributed.tensor.parallel", "torch.distributed.tensor.parallel.api")
TP_API = "parallelize_module"
DEEPSPEED_API = "DeepSpeedEngine"
FSDP1_SETTINGS = ("sharding_strategy", "forward_prefetch", "backward_prefetch",
                  "limit_all_gathers")


class ShardingProbe(OnImportProbe):
    name = "sharding"
    module = "torch.distributed.fsdp"

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.fsdp2: dict[str, Any] = {"units": 0, "reshard_after_forward": [], "mesh_size": None,
                                      "unit_bytes": []}
        self.fsdp1: dict[str, Any] = {"units": 0}
        self.zero: dict[str, Any] = {"units": 0}
        self.deepspeed: dict[str, Any] = {"units": 0}
        self.tensor: dict[str, Any] = {"units": 0, "mesh_size": None, "styles": {}}

    def imports(self) -> dict[str, Callable[[], None]]:
        return {**super().imports(), "torch.distributed.optim": self.wrap_zero,
                DEEPSPEED_MODULE: self.wrap_deepspeed, TP_MODULES[0]: self.wrap_tensor}

    def wrap_tensor(self) -> None:
        """``parallelize_module`` wherever torch exports it (a function: replaced before the
        job's own import binds it)."""
        try:
            orig = getattr(sys.modules[TP_MODULES[0]], TP_API, None)
            if not callable(orig):
                return
            wrapped = self._parallelize(orig)
            for name in TP_MODULES:
                module = sys.modules.get(name)
                if module is not None and getattr(module, TP_API, None) is orig:
                    self._wraps.patches.put(module, TP_API, wrapped)
        except Exception as err:  # evidence, never a reason to fail the job
            self.session.swallowed(self.name, "wrapping parallelize_module", err)

    def _parallelize(self, orig: Any) -> Any:
        depth = [0]  # a plan's entries are parallelised by calls of its own: counted once

        @functools.wraps(orig)
        def parallelize_module(module: Any, *args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            try:
                out = orig(module, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                try:
                    self._note_tensor(args, kwargs)
                except Exception as err:
                    self.session.swallowed(self.name, "reading parallelize_module's plan", err)
            return out

        return parallelize_module

    def _note_tensor(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        mesh = kwargs.get("device_mesh", args[0] if args else None)
        plan = kwargs.get("parallelize_plan", args[1] if len(args) > 1 else None)
        styles = list(plan.values()) if isinstance(plan, dict) else [plan] if plan else []
        t = self.tensor
        t["units"] += len(styles)
        for style in styles:
            name = type(style).__name__
            t["styles"][name] = t["styles"].get(name, 0) + 1
        if mesh is not None and t["mesh_size"] is None:
            t["mesh_size"] = int(mesh.size())

    def wrap_deepspeed(self) -> None:
        self.wrap_init(DEEPSPEED_MODULE, DEEPSPEED_API, self._deepspeed_init)

    def _deepspeed_init(self, orig: Any) -> Any:
        def note(this: Any, record: dict[str, Any], *_: Any) -> None:
            if "config" not in record:  # the first engine: training's
                record["config"] = engine_config(this)

        return self._counted(orig, self.deepspeed, note, "reading DeepSpeed's config")

    def wrap_zero(self) -> None:
        self.wrap_init("torch.distributed.optim", ZERO_API, self._zero_init)

    def _zero_init(self, orig: Any) -> Any:
        def note(_this: Any, record: dict[str, Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
            optimizer = kwargs.get("optimizer_class", args[1] if len(args) > 1 else None)
            record["settings"] = ", ".join([
                f"{getattr(optimizer, '__name__', optimizer)} state sharded",
                *(f"{k}={bool(getattr(_this, k, kwargs.get(k, False)))}"  # as built
                  for k in ZERO_SETTINGS)])

        return self._counted(orig, self.zero, note, "reading ZeroRedundancyOptimizer")

    def _counted(self, orig: Any, record: dict[str, Any],
                 note: Callable[[Any, dict[str, Any], tuple[Any, ...], dict[str, Any]], None],
                 what: str) -> Any:
        """``orig`` (a constructor) as it is, then each object it built counted in ``record``
        and ``note``d; a failure to note is the probe's, never the job's."""

        @functools.wraps(orig)
        def __init__(this: Any, *args: Any, **kwargs: Any) -> None:
            orig(this, *args, **kwargs)
            try:
                record["units"] += 1
                note(this, record, args, kwargs)
            except Exception as err:
                self.session.swallowed(self.name, what, err)

        return __init__

    def wrap(self) -> None:
        try:
            fsdp = sys.modules["torch.distributed.fsdp"]
            orig = getattr(fsdp, "fully_shard", None)
            if callable(orig):
                wrapped = self._fully_shard(orig)
                for name in FULLY_SHARD_AT:
                    module = sys.modules.get(name)
                    if module is not None and getattr(module, "fully_shard", None) is orig:
                        self._wraps.patches.put(module, "fully_shard", wrapped)
            cls = getattr(fsdp, "FullyShardedDataParallel", None)
            if cls is not None:
                self._wraps.patches.put(cls, "__init__", self._fsdp1_init(cls.__init__))
        except Exception as err:  # evidence, never a reason to fail the job
            self.session.swallowed(self.name, "wrapping FSDP", err)

    def _fully_shard(self, orig: Any) -> Any:
        @functools.wraps(orig)
        def fully_shard(module: Any, *args: Any, **kwargs: Any) -> Any:
            nbytes = self._unsharded_bytes(module)
            out = orig(module, *args, **kwargs)
            try:
                self._note_fsdp2(kwargs, nbytes)
            except Exception as err:
                self.session.swallowed(self.name, "reading fully_shard's settings", err)
            return out

        return fully_shard

    def _unsharded_bytes(self, module: Any) -> int | None:
        """The bytes of the parameters of ``module`` that no inner fully_shard sharded yet."""
        try:
            from torch.distributed.tensor import DTensor

            return sum(p.numel() * p.element_size() for p in module.parameters()
                       if not isinstance(p, DTensor))
        except Exception:
            return None

    def _note_fsdp2(self, kwargs: dict[str, Any], nbytes: int | None) -> None:
        s = self.fsdp2
        s["units"] += 1
        reshard = kwargs.get("reshard_after_forward")
        value = reshard if isinstance(reshard, bool | int) or reshard is None else str(reshard)
        if value not in s["reshard_after_forward"]:
            s["reshard_after_forward"].append(value)
        mesh = kwargs.get("mesh")
        if mesh is not None and s["mesh_size"] is None:
            s["mesh_size"] = int(mesh.size())
        if nbytes is not None and len(s["unit_bytes"]) < MAX_UNITS_KEPT:
            s["unit_bytes"].append(nbytes)

    def _fsdp1_init(self, orig: Any) -> Any:
        settings = self.fsdp1

        @functools.wraps(orig)
        def __init__(this: Any, *args: Any, **kwargs: Any) -> None:
            orig(this, *args, **kwargs)
            try:
                settings["units"] += 1
                for key in FSDP1_SETTINGS:
                    if key in kwargs and key not in settings:
                        value = kwargs[key]
                        settings[key] = value if isinstance(value, bool) else str(value)
            except Exception as err:
                self.session.swallowed(self.name, "reading FSDP's settings", err)

        return __init__

    def record(self) -> None:
        if not self.session.recording:
            return
        out = {}
        if self.fsdp2["units"]:
            out["fully_shard"] = dict(self.fsdp2)
        if self.fsdp1["units"]:
            out["FullyShardedDataParallel"] = dict(self.fsdp1)
        if self.zero["units"]:
            out[ZERO_API] = dict(self.zero)
        if self.deepspeed["units"]:
            out[DEEPSPEED_API] = dict(self.deepspeed)
        if self.tensor["units"]:
            styles = self.tensor["styles"]
            out[TP_API] = {"units": self.tensor["units"], "mesh_size": self.tensor["mesh_size"],
                           "settings": ", ".join(f"{k} {v}" for k, v in sorted(styles.items()))}
        if out:
            try:
                self.session.update_meta(sharding=out)
            except Exception as err:
                self.session.swallowed(self.name, "writing the sharded modules", err)
