"""DataLoader probe: the main process's wait per batch (and whether autograd was on as it was
asked for: an evaluation loop's batches come with it off), each iterator made or reset (an
epoch's start: ``loader_iter``) and each call that found a loader exhausted (``loader_end``),
the loader's settings, and the time each fetch (``__getitem__`` calls plus collate) and each
collate takes, in the main process for num_workers=0 and in each worker otherwise. Runs inside
the job; patches torch.utils.data in place."""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

from ..machine import private_bytes, rss_bytes
from ..record.own_frames import exception_without_own_frames
from ..record.session import STEP_DATALOADER, Session
from ..store.records import loader_key
from ..verdict import ProbeStatus


def loader_settings(loader: Any) -> dict[str, Any]:
    """The settings of a torch DataLoader that the rules reason about."""
    dataset = getattr(loader, "dataset", None)
    try:
        size: int | None = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        size = None
    collate = getattr(loader, "collate_fn", None)
    sampler = getattr(loader, "batch_sampler", None)
    return {
        "num_workers": int(getattr(loader, "num_workers", 0)),
        "batch_size": batch_size_of(loader),
        # batches made by a batch sampler (False: batching off, each sample as it is)
        "batched": sampler is not None,
        "loader_class": f"{type(loader).__module__}.{type(loader).__qualname__}",
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "dataset": type(dataset).__name__,
        "dataset_len": size,
        "collate_fn": getattr(collate, "__qualname__", type(collate).__name__),
        "sharing_strategy": _sharing_strategy(),
    }


def batch_size_of(loader: Any) -> int | None:
    """The loader's batch size: its own, or its batch sampler's where it was given one (as
    Accelerate and the Hugging Face Trainer give theirs: ``loader.batch_size`` is then None)."""
    size = getattr(loader, "batch_size", None)
    sampler = getattr(loader, "batch_sampler", None)
    for holder in (sampler, getattr(sampler, "batch_sampler", None)):
        if size is None and holder is not None:
            size = getattr(holder, "batch_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _sharing_strategy() -> str | None:
    """How tensors built in workers reach the training process (torch.multiprocessing)."""
    try:
        import torch.multiprocessing

        return str(torch.multiprocessing.get_sharing_strategy())
    except Exception:  # an optional setting (a torch without it): the others are still kept
        return None


COUNT_LIMIT = 1000  # containers and leaves looked at in one batch


def count_tensors(batch: Any) -> int:
    """Tensors in a batch (nested tuples, lists and dicts): each one a worker hands over
    separately."""
    import torch

    pending, seen, tensors = [batch], 0, 0
    while pending and seen < COUNT_LIMIT:
        item = pending.pop()
        seen += 1
        if isinstance(item, torch.Tensor):
            tensors += 1
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
    return tensors


class DataLoaderProbe:
    name = "dataloader"

    def __init__(self, session: Session) -> None:
        self.session = session
        self._patched: list[tuple[Any, str, Any]] = []

    def check(self) -> ProbeStatus:
        try:
            from torch.utils.data.dataloader import _BaseDataLoaderIter  # noqa: F401
        except ImportError as err:
            return ProbeStatus(False, f"torch.utils.data internals changed ({err})",
                               "call doctor.step() per step; input wait is then not measured")
        return ProbeStatus(True)

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        self._patched.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, new)

    def start(self) -> None:
        import torch
        from torch.utils.data import dataloader as dl
        from torch.utils.data._utils import fetch, worker

        session = self.session
        clock = session.clock
        grad_enabled = torch.is_grad_enabled
        base = dl._BaseDataLoaderIter
        orig_init, orig_next = base.__init__, base.__next__

        @functools.wraps(orig_init)
        def __init__(self: Any, loader: Any) -> None:
            orig_init(self, loader)
            self._doctor_count = True
            try:
                self._doctor_loader = session.record_loader(loader_settings(loader))
            except Exception as err:  # settings are evidence, never a reason to fail the job
                self._doctor_loader = -1
                session.swallowed("dataloader", "recording a DataLoader's settings", err)
            self._doctor_key = loader_key(self._doctor_loader)
            self._doctor_no_grad = loader_key(self._doctor_loader, grad=False)

        @functools.wraps(orig_next)
        def __next__(self: Any) -> Any:
            t0 = clock()
            try:
                batch = orig_next(self)
            except StopIteration:  # the loader is exhausted (its workers shut down, if any)
                session.record_interval("loader_end", t0, clock(), self._doctor_loader)
                raise
            session.record_interval("loader_wait", t0, clock(), self._doctor_key
                                    if grad_enabled() else self._doctor_no_grad)
            session.count_step(STEP_DATALOADER)
            if self._doctor_count:  # the first batch of each iterator: its tensors
                self._doctor_count = False
                try:
                    session.record_batch_tensors(self._doctor_loader, count_tensors(batch))
                except Exception as err:  # a count is evidence, never a reason to fail the job
                    session.swallowed("dataloader", "counting a batch's tensors", err)
            return batch

        self._patch(base, "__init__", __init__)
        self._patch(base, "__next__", __next__)
        orig_iter = dl.DataLoader.__iter__

        @functools.wraps(orig_iter)
        def __iter__(self: Any) -> Any:
            """An epoch (or an evaluation pass) starts: the iterator made, or reset where the
            workers persist; with workers that do not, this is where they start."""
            t0 = clock()
            it = orig_iter(self)
            session.record_interval("loader_iter", t0, clock(),
                                    getattr(it, "_doctor_loader", -1))
            return it

        self._patch(dl.DataLoader, "__iter__", __iter__)

        for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
            self._patch(cls, "fetch", _timed_fetch(cls.fetch, session))
        orig_fetcher_init = fetch._BaseDatasetFetcher.__init__

        @functools.wraps(orig_fetcher_init)
        def fetcher_init(self: Any, dataset: Any, auto_collation: Any, collate_fn: Any,
                         drop_last: Any) -> None:
            orig_fetcher_init(self, dataset, auto_collation, _timed_collate(collate_fn, session),
                              drop_last)

        self._patch(fetch._BaseDatasetFetcher, "__init__", fetcher_init)

        self._worker_tracebacks()
        orig_loop = worker._worker_loop
        worker_id_at = list(inspect.signature(orig_loop).parameters).index("worker_id")

        @functools.wraps(orig_loop)
        def _worker_loop(*args: Any, **kwargs: Any) -> Any:
            worker_id = kwargs.get("worker_id", args[worker_id_at] if len(args) > worker_id_at
                                   else -1)
            session.role = f"worker{worker_id}"
            _record_memory(session, "memory_at_start")
            try:
                return orig_loop(*args, **kwargs)
            finally:  # the loop returns when the loader shuts its workers down
                _record_memory(session, "memory_at_end")

        # DataLoader resolves the target when it creates a worker; spawn children find this
        # wrapper by name once their own bootstrap has patched the module.
        self._patched.append((worker, "_worker_loop", orig_loop))
        worker._worker_loop = _worker_loop

    def _worker_tracebacks(self) -> None:
        """A worker's exception is formatted in the worker by torch's ExceptionWrapper, into
        the "Original Traceback" the main process prints: formatted without doctor's wrappers
        (``fetch``, the collate_fn's timer; doctor.record.own_frames)."""
        from torch import _utils as torch_utils

        cls = torch_utils.ExceptionWrapper
        orig = cls.__init__

        @functools.wraps(orig)
        def __init__(self: Any, exc_info: Any = None, where: str = "in background") -> None:
            if exc_info is None:
                exc_info = sys.exc_info()
            try:
                if exc_info[1] is not None:
                    exception_without_own_frames(exc_info[1])
                    exc_info = (exc_info[0], exc_info[1], exc_info[1].__traceback__)
            except Exception:  # a tuple of another shape: formatted as it came
                pass
            orig(self, exc_info, where)

        self._patch(cls, "__init__", __init__)

    def sample(self) -> None:
        pass  # the patched iterator records as the job runs

    def stop(self) -> None:
        for owner, name, orig in reversed(self._patched):
            setattr(owner, name, orig)
        self._patched = []


def _timed_collate(collate_fn: Any, session: Session) -> Any:
    """Time each call of the loader's collate_fn (in the process that builds the batch)."""
    if collate_fn is None or getattr(collate_fn, "_doctor_timed", False):
        return collate_fn
    clock = session.clock

    def collate(batch: Any) -> Any:
        t0 = clock()
        out = collate_fn(batch)
        session.record_interval("collate", t0, clock())
        return out

    collate._doctor_timed = True  # type: ignore[attr-defined]
    collate.__qualname__ = getattr(collate_fn, "__qualname__", "collate_fn")
    return collate


SAMPLE_FROM_FETCH = 3  # in-process stack sampling in a worker starts at its third batch


def _timed_fetch(orig: Any, session: Session) -> Any:
    clock = session.clock
    fetches = [0]

    @functools.wraps(orig)
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        t0 = clock()
        out = orig(self, possibly_batched_index)
        session.record_interval("fetch", t0, clock())
        fetches[0] += 1
        if fetches[0] == SAMPLE_FROM_FETCH and session.role.startswith("worker"):
            _maybe_sample_worker(session)
        return out

    return fetch


def _record_memory(session: Session, key: str) -> None:
    """A worker's own and resident bytes as it starts and as it ends (~10 ms each for a large
    parent): copy-on-read shows between the two (doctor.analyse.memory_growth) even in a worker
    that lives for less than the host probe's interval."""
    try:
        session.update_meta(**{key: {"t_ns": session.clock(), "private_bytes": private_bytes(),
                                     "rss_bytes": rss_bytes()}})
    except Exception as err:  # a measurement never stops a worker
        session.swallowed("dataloader", "reading a worker's memory", err)


def _maybe_sample_worker(session: Session) -> None:
    """Without py-spy, a worker samples its own stacks for a few seconds (probes.stacks)."""
    from .stacks import sample_own_stacks_if_asked

    sample_own_stacks_if_asked(session)
