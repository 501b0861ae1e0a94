"""Inside a job run by ``doctor try``: apply the settings being tried (doctor.tuning), in every
process, without touching the job's code.

- ``dataloader``, ``ddp`` and ``zero`` settings override the keyword arguments of every
  DataLoader, DistributedDataParallel and ZeroRedundancyOptimizer the job builds (in its script
  or in a library), at construction, and ``fsdp1`` those of every FSDP1
  FullyShardedDataParallel (its enums given by name); ``fsdp`` those of every FSDP2
  ``fully_shard`` call (the function wrapped where torch exports it, once the job imports
  torch.distributed.fsdp); ``pipeline`` those of every torch.distributed.pipelining schedule;
- ``deepspeed`` settings are keys of the config the job gives ``deepspeed.initialize``
  (doctor.record.deepspeed_override);
- ``torch`` settings are set right after ``import torch``, before user code goes on; a later
  call of the job's own (``torch.set_num_threads(4)``) keeps the tried value in the training
  process, and torch's own calls in DataLoader workers pass through; ``compile=off`` makes
  ``torch.compile`` (and ``nn.Module.compile``) hand back what it was given, so the job runs
  eagerly (doctor.record.eager);
- ``env`` was set by ``doctor try`` for the whole job before it started.

Each change is said once on stderr (``doctor try: DataLoader(num_workers 0 -> 2)``, by rank 0),
and what the job had or asked for, beside what was tried, goes to the process's meta
(``tried``) so that ``doctor try`` can tell "changed nothing: the job already had it" and
"never reached: the job built no DataLoader" from a real change. A failure here is noted there
and never stops the job.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..tuning import WHERE, Apply, normalize
from . import parallel_overrides
from .after_import import AfterImport, when_imported
from .eager import eager_patches
from .session import CLOSE, Session

ENV_APPLY = "DOCTOR_TRY_APPLY"  # the apply record, JSON
MAX_SEEN = 20  # job values kept per setting


def from_env(session: Session) -> Overrides | None:
    text = os.environ.get(ENV_APPLY)
    if not text:
        return None
    try:
        apply = normalize(json.loads(text))
    except (ValueError, TypeError) as err:
        overrides = Overrides({}, session)
        overrides.errors.append(f"unreadable {ENV_APPLY}: {err}")
        return overrides
    return Overrides(apply, session)


class Overrides:
    """The settings of one try, applied in this process (``start`` once torch is imported)."""

    def __init__(self, apply: Apply, session: Session,
                 say: Callable[[str], None] | None = None) -> None:
        self.apply = apply
        self.session = session
        self.say = say or _say_on_stderr
        self.seen: dict[str, dict[str, Any]] = {}
        self.errors: list[str] = []
        self._said: set[str] = set()
        self._restore: list[tuple[Any, str, Any]] = []
        self._building: set[int] = set()  # objects an overridden __init__ is constructing
        self._waiting: list[AfterImport] = []  # overrides waiting for the job's import
        session.on(CLOSE, self.save)

    # ----- what the job had, beside what is tried ----------------------------------------
    def note(self, setting: str, job_value: Any, tried: Any, applied: bool = True) -> None:
        entry = self.seen.setdefault(setting, {"tried": tried, "job": [], "applied": 0})
        if len(entry["job"]) < MAX_SEEN:
            entry["job"].append(job_value)
        entry["applied"] += int(applied)

    def asked(self, setting: str, job_value: Any) -> None:
        """The job itself asked for ``job_value`` later (kept at the tried value)."""
        entry = self.seen.get(setting)
        if entry is not None:
            entry["asked"] = job_value

    def changed(self, section: str, where: str, settings: list[tuple[str, Any, Any]]) -> None:
        """Each (key, the job's value, the tried one) of ``section`` noted, the changes said
        once as ``where(...)``, the meta saved."""
        changes = []
        for key, job, value in settings:
            self.note(f"{section}.{key}", job, value)
            if job != value:
                changes.append(f"{key} {job} -> {value}")
        self.tell(f"{where}({', '.join(changes) or 'nothing to change'})")
        self.save()

    def tell(self, text: str) -> None:
        if text in self._said:
            return
        self._said.add(text)
        if _speaks():
            self.say(f"doctor try: {text}")

    def save(self) -> None:
        """Into the process's meta, where the process recorded anything (the training ones)."""
        if not self.session.recording or not (self.seen or self.errors):
            return
        try:
            self.session.update_meta(tried=self.seen, tried_errors=self.errors)
        except OSError:
            pass

    # ----- applying -----------------------------------------------------------------------
    def start(self) -> None:
        for section, step in (("torch", self._torch), ("dataloader", self._dataloader),
                              ("ddp", self._ddp), ("optimizer", self._optimizer),
                              ("zero", self._zero), ("fsdp", self._fsdp),
                              ("fsdp1", self._fsdp1), ("pipeline", self._pipeline),
                              ("deepspeed", self._deepspeed)):
            if section in self.apply:
                try:
                    step(self.apply[section])
                except Exception as err:  # the job runs on; the try says what was not applied
                    self.errors.append(f"{section}: {type(err).__name__}: {err}")
        if self.session.recording:
            self.save()

    def stop(self) -> None:
        for finder in self._waiting:
            finder.remove()
        self._waiting = []
        for owner, name, orig in reversed(self._restore):
            setattr(owner, name, orig)
        self._restore = []

    def patch(self, owner: Any, name: str, new: Any) -> None:
        self._restore.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def _torch(self, values: dict[str, Any]) -> None:
        import torch

        setters: dict[str, tuple[Any, str, Callable[[], Any]]] = {
            "num_threads": (torch, "set_num_threads", torch.get_num_threads),
            "num_interop_threads": (torch, "set_num_interop_threads",
                                    torch.get_num_interop_threads),
            "matmul_precision": (torch, "set_float32_matmul_precision",
                                 torch.get_float32_matmul_precision),
            "sharing_strategy": (torch.multiprocessing, "set_sharing_strategy",
                                 torch.multiprocessing.get_sharing_strategy),
        }
        for key, value in values.items():
            setting = f"torch.{key}"
            if key == "compile":
                if value == "off":
                    for owner, name, new in eager_patches(torch, self._compile_asked):
                        self.patch(owner, name, new)
                continue
            if key in setters:
                owner, name, getter = setters[key]
                before = getter()
                getattr(owner, name)(value)
                self.note(setting, before, value)
                self.tell(f"torch.{name}({before} -> {value})" if before != value
                          else f"torch.{name}: already {value}")
                self._keep(owner, name, setting, value)
            elif key == "allow_tf32":
                before = bool(torch.backends.cuda.matmul.allow_tf32)
                torch.backends.cuda.matmul.allow_tf32 = value
                torch.backends.cudnn.allow_tf32 = value
                self.note(setting, before, value)
                self.tell(f"allow_tf32 {before} -> {value}")
            elif key == "cudnn_benchmark":
                before = bool(torch.backends.cudnn.benchmark)
                torch.backends.cudnn.benchmark = value
                self.note(setting, before, value)
                self.tell(f"cudnn.benchmark {before} -> {value}")

    def _compile_asked(self) -> None:
        self.note("torch.compile", "on", "off")
        self.tell("torch.compile -> eager (compile=off): the model runs uncompiled")
        self.save()

    def _keep(self, owner: Any, name: str, setting: str, value: Any) -> None:
        """Later calls of ``owner.name`` by the training process keep the tried value; a
        DataLoader worker's (torch sets one thread in each) pass through."""
        orig = getattr(owner, name)
        session = self.session

        @functools.wraps(orig)
        def kept(asked: Any, *args: Any, **kwargs: Any) -> Any:
            if session.role != "main":
                return orig(asked, *args, **kwargs)
            self.asked(setting, asked)
            if asked != value:
                self.tell(f"the job's {name}({asked}) kept at {value}")
            return None

        self.patch(owner, name, kept)

    def _dataloader(self, values: dict[str, Any]) -> None:
        from torch.utils.data import DataLoader, IterableDataset

        def adjust(arguments: dict[str, Any], job: dict[str, Any]) -> list[str]:
            notes = []
            if arguments.get("num_workers", 0) == 0:
                # settings that torch refuses without workers
                for key, off in (("persistent_workers", False), ("prefetch_factor", None)):
                    if arguments.get(key, off) != off:
                        arguments[key] = off
                        notes.append(f"{key} needs workers: left at {off}")
            elif isinstance(arguments.get("dataset"), IterableDataset) and \
                    job.get("num_workers", 0) == 0:
                notes.append("an IterableDataset in workers: each worker iterates it unless it "
                             "shards by get_worker_info()")
            return notes

        self.override_init(DataLoader, "dataloader", values, adjust)

    def _ddp(self, values: dict[str, Any]) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.override_init(DistributedDataParallel, "ddp", values)

    def _zero(self, values: dict[str, Any]) -> None:
        """Once the job imports torch.distributed.optim (never imported for it: 0.65 s a
        process here)."""

        def override() -> None:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.override_init(ZeroRedundancyOptimizer, "zero", values)

        self._after_import("torch.distributed.optim", "zero", override)

    def _fsdp(self, values: dict[str, Any]) -> None:
        self._after_import("torch.distributed.fsdp", "fsdp",
                           lambda: parallel_overrides.fully_shard_calls(self, values))

    def _fsdp1(self, values: dict[str, Any]) -> None:
        self._after_import("torch.distributed.fsdp", "fsdp1",
                           lambda: parallel_overrides.fsdp1_units(self, values))

    def _pipeline(self, values: dict[str, Any]) -> None:
        self._after_import("torch.distributed.pipelining", "pipeline",
                           lambda: parallel_overrides.pipeline_schedules(self, values))

    def _deepspeed(self, values: dict[str, Any]) -> None:
        """The config given to ``deepspeed.initialize``, once the job imports deepspeed
        (doctor.record.deepspeed_override)."""

        def override() -> None:
            from .deepspeed_override import wrapped_initialize

            deepspeed = sys.modules["deepspeed"]
            self.patch(deepspeed, "initialize",
                       wrapped_initialize(self, deepspeed.initialize, values))

        self._after_import("deepspeed", "deepspeed", override)

    def _after_import(self, module: str, section: str, override: Callable[[], None]) -> None:
        """``override`` once the job imports ``module`` (now, where it has); a failure is the
        try's to say, never the job's."""

        def guarded() -> None:
            try:
                override()
            except Exception as err:  # the job runs on; the try says what was not applied
                self.errors.append(f"{section}: {type(err).__name__}: {err}")

        finder = when_imported(module, guarded)
        if finder is not None:
            self._waiting.append(finder)

    def _optimizer(self, values: dict[str, Any]) -> None:
        """Every torch.optim class whose constructor takes the setting (fused, foreach)."""
        import torch

        def adjust(arguments: dict[str, Any], job: dict[str, Any]) -> list[str]:
            if arguments.get("fused") and arguments.get("foreach"):  # torch refuses both
                arguments["foreach"] = None
                return ["foreach left to torch beside fused"]
            return []

        base = torch.optim.Optimizer
        self.override_classes({c for c in vars(torch.optim).values()
                               if isinstance(c, type) and issubclass(c, base) and c is not base},
                              "optimizer", values, adjust)

    def override_classes(self, classes: Iterable[type], section: str, values: dict[str, Any],
                         adjust: Callable[[dict[str, Any], dict[str, Any]], list[str]]
                         | None = None) -> None:
        """override_init for each of a family of ``classes`` whose constructor takes any of
        the settings, with those it takes (one that none takes is never met: said by the try)."""
        for cls in classes:
            params = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
            known = {k: v for k, v in values.items() if k in params}
            if known:
                self.override_init(cls, section, known, adjust)

    def known_settings(self, params: Mapping[str, Any], values: dict[str, Any], section: str
                       ) -> dict[str, Any]:
        """The settings of ``values`` that a signature of ``params`` takes; each other is noted
        as one this torch lacks."""
        known = {k: v for k, v in values.items() if k in params}
        for key in set(values) - set(known):
            self.errors.append(f"{WHERE[section]} of this torch has no {key}")
        return known

    def override_init(self, cls: type, section: str, values: dict[str, Any],
                       adjust: Callable[[dict[str, Any], dict[str, Any]], list[str]]
                       | None = None, shown: Callable[[Any], Any] = lambda v: v) -> None:
        """``values`` given to every ``cls`` built; ``shown``: a value as it is noted and said
        (an enum by its name, as the apply record names it)."""
        orig = cls.__init__  # type: ignore[misc]
        signature = inspect.signature(orig)
        params = signature.parameters
        known = self.known_settings(params, values, section)
        overrides = self

        @functools.wraps(orig)
        def __init__(this: Any, *args: Any, **kwargs: Any) -> None:
            if id(this) in overrides._building:  # a subclass's patched __init__ calling ours
                return orig(this, *args, **kwargs)
            try:
                bound = signature.bind(this, *args, **kwargs)
            except TypeError:  # the job's own mistake: let torch say it
                return orig(this, *args, **kwargs)
            arguments = bound.arguments
            job = {k: arguments.get(k, params[k].default) for k in known}
            arguments.update(known)
            notes = adjust(arguments, job) if adjust else []
            changes = []
            for key in known:
                now = arguments.get(key, params[key].default)
                overrides.note(f"{section}.{key}", shown(job[key]), shown(now),
                               applied=now == known[key])
                if job[key] != now:
                    changes.append(f"{key} {shown(job[key])} -> {shown(now)}")
            if not overrides._building:  # not one built by another's __init__ (FSDP1's
                # auto-wrapped units are given the root's, tried, settings): said by the root
                overrides.tell(f"{WHERE[section]}({', '.join(changes) or 'nothing to change'})"
                               + "".join(f"; {n}" for n in notes))
            overrides.save()
            overrides._building.add(id(this))
            try:
                return orig(*bound.args, **bound.kwargs)
            finally:
                overrides._building.discard(id(this))

        self.patch(cls, "__init__", __init__)


def _speaks() -> bool:
    """Whether this process says the changes: rank 0, or a job without ranks (not the torchrun
    launcher, whose ranks say them)."""
    rank = os.environ.get("RANK")
    if rank is not None:
        return rank == "0"
    launcher = sys.argv[0] if sys.argv else ""
    return not launcher.endswith(("torchrun", os.path.join("distributed", "run.py")))


def _say_on_stderr(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
