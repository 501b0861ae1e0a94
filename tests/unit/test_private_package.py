"""Invisible to the job's imports: under ``doctor run`` doctor's in-job code has a private
package name, nothing heavy is imported before the job's first line, and a project's own
``doctor`` package is the one it imports, while ``doctor.step()`` of ours still reaches the
bootstrap's Session.

The tests here run no job, process nor clock (tests/unit); those that do are in
tests/e2e/test_private_package.py.
"""

from __future__ import annotations

from pathlib import Path

from doctor.record import session
from tests.support import ROOT


def test_the_private_name_is_the_bootstraps() -> None:
    text = (ROOT / "doctor" / "record" / "_bootstrap" / "sitecustomize.py").read_text()
    assert f'PRIVATE = "{session.PRIVATE_PACKAGE}"' in text


def test_a_try_is_read_from_the_names_its_modules_use() -> None:
    from doctor import bootstrap
    from doctor.record import overrides, stop

    assert (bootstrap.ENV_TRY_APPLY, bootstrap.ENV_TRY_STOP) == (overrides.ENV_APPLY,
                                                                 stop.ENV_STOP_AFTER)


IN_JOB_ROOTS = ("doctor/bootstrap.py", "doctor/record/overrides.py",
                "doctor/record/stop.py", "probes/__init__.py")


def _module_file(package: list[str], level: int, name: str | None) -> Path | None:
    """The file of a relative import ``from .{level}name`` made in ``package`` (a list of
    folder names under the checkout), or None where it names no module of doctor's."""
    base = package[: len(package) - level + 1]
    parts = [*base, *(name.split(".") if name else [])]
    if parts[:2] == ["doctor", "probes"]:  # doctor.probes (from doctor/bootstrap.py) is probes/
        parts = parts[1:]
    for top in ((), ("doctor",)):  # probes/ is doctor.probes: its parents are doctor's
        path = ROOT.joinpath(*top, *parts) if top else ROOT.joinpath(*parts)
        if path.with_suffix(".py").is_file():
            return path.with_suffix(".py")
        if (path / "__init__.py").is_file():
            return path / "__init__.py"
    return None


def test_no_module_that_runs_in_the_job_imports_doctor_by_its_public_name() -> None:
    """Every module reachable from the bootstrap and the job's probes, by any import (at module
    level or in a function), imports doctor's modules relatively: an absolute ``doctor...``
    import inside the job would load the public package, or the job's own ``doctor``."""
    import ast

    todo = [ROOT / p for p in IN_JOB_ROOTS]
    todo += [ROOT / "probes" / f"{spec.factory[1:].split(':')[0]}.py"
             for spec in __import__("doctor.probes", fromlist=["REGISTRY"]).REGISTRY
             if spec.side == "job"]
    seen: set[Path] = set()
    absolute: list[str] = []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        rel = path.relative_to(ROOT)
        package = list(rel.parent.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                absolute += [f"{rel}:{node.lineno}" for a in node.names
                             if a.name.split(".")[0] == "doctor"]
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    if (node.module or "").split(".")[0] == "doctor":
                        absolute.append(f"{rel}:{node.lineno}")
                    continue
                targets = [_module_file(package, node.level, node.module)]
                targets += [_module_file(package, node.level,
                                         f"{node.module}.{a.name}" if node.module else a.name)
                            for a in node.names]
                todo += [t for t in targets if t is not None]
    assert len(seen) > 20  # the walk found the in-job modules
    assert not absolute, absolute
