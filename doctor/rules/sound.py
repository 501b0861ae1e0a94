"""The last check on the rules' findings, before the verdict numbers their fixes: no fix is
offered that doctor itself estimates to make the job slower (its estimate below 1.0x), and none
whose settings are all what the job already has (``num_workers=2`` to loaders that have 2, one
thread to a job on one), nor ``torch.compile(model)`` to a job that compiles already, nor an
autocast to the (device, dtype) the job autocasts to already: a fix that changes nothing would
be tried by ``doctor try`` and measured as noise. A finding's own
estimate below 1.0x is left out too. The findings themselves stay: what they found is still so.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

import pandas as pd

from doctor.analyse.stages import JobFacts
from doctor.verdict import Finding, Fix

Settings = Mapping[str, Mapping[str, Any]]  # as a fix's apply: section -> setting -> value

#: The loader settings read back from the job's DataLoaders (doctor.store.rundata's loaders),
#: by the section and name of the apply record (doctor.tuning) that sets them.
LOADER_SETTINGS = {("dataloader", "num_workers"): "num_workers",
                   ("dataloader", "pin_memory"): "pin_memory",
                   ("dataloader", "persistent_workers"): "persistent_workers",
                   ("dataloader", "prefetch_factor"): "prefetch_factor",
                   ("torch", "sharing_strategy"): "sharing_strategy"}


def job_settings(job: JobFacts, loaders: pd.DataFrame | None) -> dict[str, dict[str, Any]]:
    """What the job already has, in apply's terms: torch's intra-op threads, and each loader
    setting on which all the training processes' DataLoaders agree."""
    out: dict[str, dict[str, Any]] = {}
    if job.torch_threads is not None:
        out.setdefault("torch", {})["num_threads"] = int(job.torch_threads)
    if loaders is None or loaders.empty:
        return out
    for (section, name), column in LOADER_SETTINGS.items():
        if column not in loaders:
            continue
        values = {_plain(v) for v in loaders[column]}
        if len(values) == 1 and None not in values:
            out.setdefault(section, {})[name] = values.pop()
    return out


#: The code of every fix that compiles the model as it stands (doctor.rules.compute, ops);
#: other modes than the default stay: reduce-overhead is a change for a compiled model too
PLAIN_COMPILE = "model = torch.compile(model)"
#: An autocast in a fix's code (doctor.analyse.precision.Precision.autocast_code writes them):
#: its device and dtype.
AUTOCAST = re.compile(r"torch\.autocast\(\s*(?:device_type=)?[\"'](\w+)[\"']\s*,\s*"
                      r"dtype=torch\.(\w+)")


def sound_findings(findings: Iterable[Finding], current: Settings,
                   compiled: bool = False,
                   autocasts: Collection[tuple[str, str]] = ()) -> list[Finding]:
    """``findings`` without the fixes of the module docstring (``compiled``: the job runs
    torch.compile already; ``autocasts``: the (device, dtype) it autocasts to), and without an
    estimate below 1.0x."""
    out = []
    for f in findings:
        fixes = tuple(x for x in f.fixes if not _slower(x) and not already_set(x, current)
                      and not (compiled and PLAIN_COMPILE in x.code)
                      and not _autocasts_already(x, autocasts))
        speedup = f.estimated_speedup
        if speedup is not None and speedup < 1.0:
            speedup = None
        out.append(f if fixes == f.fixes and speedup == f.estimated_speedup
                   else replace(f, fixes=fixes, estimated_speedup=speedup))
    return out


def already_set(fix: Fix, current: Settings) -> bool:
    """Whether every setting ``fix`` applies is what the job already has."""
    if not fix.apply:
        return False
    wanted = [(section, name, value) for section, values in fix.apply.items()
              for name, value in values.items()]
    return bool(wanted) and all(section in current and name in current[section]
                                and current[section][name] == _plain(value)
                                for section, name, value in wanted)


def _autocasts_already(fix: Fix, autocasts: Collection[tuple[str, str]]) -> bool:
    """Whether ``fix``'s code autocasts to a (device, dtype) the job autocasts to already."""
    return any((m.group(1), m.group(2)) in autocasts for m in AUTOCAST.finditer(fix.code or ""))


def _slower(fix: Fix) -> bool:
    return fix.estimated_speedup is not None and fix.estimated_speedup < 1.0


def _plain(value: Any) -> Any:
    """A frame's value as Python's own (numpy scalars; NaN, None: unknown)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    return value
