"""Names for a job's parameters (doctor.probes.overflow_watch): each parameter's module path,
the module's class and the parameter's own name ("encoder.layers.3.attn", "Linear", "weight"),
from the model that holds it; its index and shape where no module does.

The model is the module the job last put in training mode (``model.train()``, seen by
doctor.probes.eval_mode) where it holds the parameters; else the modules alive in the process
that no other module holds (one pass over the collector's objects: about 0.2 s for 1.4 million
objects, at most once per period of the watch). The calling frames' locals are not read: on
Python before 3.13 that leaves a snapshot of them on the frame, holding the job's tensors of the
moment (a batch, the logits) until the frame ends. Nothing here changes a module.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

MAX_ROOTS = 64  # models compared for the parameters they hold


def parameter_names(torch: Any, params: list[Any], trained: Any = None
                    ) -> tuple[list[dict[str, Any]], Any]:
    """For each of ``params``: {"module", "class", "param", "shape"} where a model (``trained``
    first, then every model alive) holds it, else {"param": "#i", "shape"}; and the model that
    named the first of them (``trained``, or the one alive that holds most; None: no module
    holds any)."""
    wanted = {id(p): i for i, p in enumerate(params)}
    named: dict[int, tuple[str, str, str]] = {}
    model = None
    for root in _candidates(torch.nn.Module, trained, wanted):
        before = len(named)
        try:
            _name(root, wanted, named)
        except Exception:  # a module of odd ways: its parameters are named another way
            continue
        if model is None and len(named) > before:
            model = root
        if len(named) == len(params):
            break
    out = []
    for i, p in enumerate(params):
        shape = "x".join(str(int(d)) for d in getattr(p, "shape", ()))
        if i in named:
            module, cls, leaf = named[i]
            out.append({"module": module, "class": cls, "param": leaf, "shape": shape})
        else:
            out.append({"module": "", "class": "", "param": f"#{i}", "shape": shape})
    return out, model


def _candidates(module_type: type, trained: Any, wanted: dict[int, int]) -> Iterator[Any]:
    """``trained`` where given, then the models alive (see _roots), lazily."""
    if trained is not None:
        yield trained
    yield from _roots(module_type, wanted)


def _roots(module_type: type, wanted: dict[int, int]) -> list[Any]:
    """The modules alive that no other module holds, those that hold most of ``wanted`` (then
    with the shortest names: a model before the wrapper around it) first."""
    found = [o for o in gc.get_objects() if issubclass(type(o), module_type)]
    held = {id(c) for m in found for c in (vars(m).get("_modules") or {}).values()}
    ranked: list[tuple[int, int, int, Any]] = []
    for root in (m for m in found if id(m) not in held):
        try:
            hits = [n for n, p in root.named_parameters() if id(p) in wanted]
        except Exception:  # a module whose parameters cannot be listed: not a candidate
            continue
        if hits:
            ranked.append((-len(hits), sum(map(len, hits)), len(ranked), root))
    ranked.sort(key=lambda r: r[:3])
    return [r[3] for r in ranked[:MAX_ROOTS]]


def _name(root: Any, wanted: dict[int, int], named: dict[int, tuple[str, str, str]]) -> None:
    classes = {path: type(m).__name__ for path, m in root.named_modules()}
    for name, p in root.named_parameters():
        i = wanted.get(id(p))
        if i is not None and i not in named:
            path, _, leaf = name.rpartition(".")
            named[i] = (unwrapped(path), classes.get(path, ""), leaf)


def unwrapped(path: str) -> str:
    """A module's path without the wrappers' own prefixes (DDP's ``module.``, a compiled
    module's ``_orig_mod.``)."""
    for prefix in ("module.", "_orig_mod."):
        while path.startswith(prefix):
            path = path[len(prefix):]
    return path if path not in ("module", "_orig_mod") else ""
