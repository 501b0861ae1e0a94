"""The tests' own layout holds (README, Development): a test module imports the support modules
(tests/support.py, tests/trace_files.py and the named helpers beside them), never another test
module; and a module under tests/unit starts no process through subprocess, runs no doctor CLI
and sleeps no longer than a few milliseconds, so ``pytest tests/unit`` stays the quick loop."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import ROOT

TESTS = ROOT / "tests"
#: The longest sleep a unit test may take (distinct file times, a thread's turn).
MAX_SLEEP_S = 0.05


def modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("test_*.py"))


def imported(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


def test_no_test_module_imports_another() -> None:
    found = {}
    for path in modules(TESTS):
        bad = [n for n in imported(ast.parse(path.read_text())) if n.startswith(".")
               or any(part.startswith("test_") or part in ("unit", "e2e", "sweeps", "conftest")
                      for part in n.split(".")[1:] if n.startswith("tests."))]
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    assert not found, f"test modules importing test modules (use tests/support.py): {found}"


def long_sleeps(tree: ast.AST) -> list[int]:
    """Lines that call ``sleep`` for longer than MAX_SLEEP_S, or for a time not written out."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (
                getattr(node.func, "attr", None) == "sleep"
                or getattr(node.func, "id", None) == "sleep"):
            arg = node.args[0] if node.args else None
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, int | float)
                    and arg.value <= MAX_SLEEP_S):
                lines.append(node.lineno)
    return lines


def test_unit_modules_start_no_process_and_do_not_sleep() -> None:
    found = {}
    for path in modules(TESTS / "unit"):
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        bad = [n for n in imported(tree) if n.split(".")[0] == "subprocess"]
        bad += sorted(names & {"doctor_cmd", "parallel_cores", "skip_if_the_cores_were_taken"})
        bad += [f"sleep at line {line}" for line in long_sleeps(tree)]
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    assert not found, f"unit modules that belong in tests/e2e: {found}"
