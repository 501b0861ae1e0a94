"""Stages import downward only: the import graph between doctor's packages has no cycle, and
every import goes to the same layer or one below it (LAYERS).

The graph is built statically, with ``ast``, over doctor/, probes/ and reports/ (installed as
doctor.probes and doctor.reports: pyproject.toml's package-dir), every import counted: at module
level, inside a function, or under ``TYPE_CHECKING`` (an import made late still ties the two
packages together; a reader and mypy follow it all the same). Relative imports are resolved from
the importing file's package. A node of the graph is a package of doctor (``doctor.analyse``,
all its modules together) or a module at the top of doctor/ (``doctor.verdict``), and
``doctor`` itself (its __init__, the public API).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path

import pytest

from tests.support import ROOT

FOLDERS = {"doctor": "doctor", "probes": "doctor.probes", "reports": "doctor.reports"}

# The layers, lowest first: a node may import a node of its own layer (the cycle test keeps
# those in order) or of a layer below it, never one above.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # the shared kernel, the modules at the top of doctor/ below every stage: the types,
    # settings and facts every stage speaks (errors, categories, tuning: in the job too). The
    # other modules at the top of doctor/ are doors (the last layer) or the pipeline: a new one
    # is placed in one of the three (README's Development map names each).
    ("kernel", ("doctor.errors", "doctor.categories", "doctor.version", "doctor.tuning",
                "doctor.verdict", "doctor.machine", "doctor.command", "doctor.units",
                "doctor.step_pace")),
    ("trace", ("doctor.trace",)),  # the torch.profiler / Kineto trace reader
    ("store", ("doctor.store",)),  # the run directory: in-job writers, readers -> RunData
    ("record", ("doctor.record",)),  # in the job: the Session, its ring buffers, the tracer
    ("probes", ("doctor.probes",)),  # one module per source, feeding a Session or the parent
    ("analyse", ("doctor.analyse",)),  # RunData -> each stage's record, and the Evidence
    ("rules", ("doctor.rules",)),  # the Evidence -> findings
    ("pipeline", ("doctor.pipeline",)),  # analyse, then the rules, then the verdict: Analysis
    ("reports", ("doctor.reports",)),  # an Analysis -> text, html, verdict.json
    # the doors: doctor run (and its in-job start, bootstrap), doctor.watch, doctor try, the CLI
    ("doors", ("doctor", "doctor.bootstrap", "doctor.cli", "doctor.launch", "doctor.watch",
               "doctor.outputs", "doctor.run_summary", "doctor.progress", "doctor.nodes",
               "doctor.job_record", "doctor.compat", "doctor.exit_wait", "doctor.sampler",
               "doctor.sources", "doctor.reporting", "doctor.run_door", "doctor.tries",
               "doctor.after_job", "doctor.report_warmup")),
)

Edges = Mapping[tuple[str, str], list[str]]  # (node, node) -> "file:line imports module"


def _modules() -> dict[str, Path]:
    """Every module of doctor by its installed name (a package by its __init__)."""
    out: dict[str, Path] = {}
    for folder, name in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [*name.split("."), *path.relative_to(ROOT / folder).with_suffix("").parts]
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def node_of(module: str) -> str:
    """``doctor.analyse.steps`` -> ``doctor.analyse``; ``doctor.verdict`` -> itself."""
    return ".".join(module.split(".")[:2])


def module_edges() -> Edges:
    """(importing node, imported node) -> where, for every import of one of doctor's modules
    by another that crosses nodes."""
    modules = _modules()
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, path in modules.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                stem = ".".join([*base, *([node.module] if node.module else [])])
                # ``from doctor import probes`` imports the module doctor.probes
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem
                           for a in node.names]
            else:
                continue
            for target in dict.fromkeys(targets):  # once per statement
                if target in modules and node_of(target) != node_of(module):
                    where = f"{path.relative_to(ROOT)}:{node.lineno} imports {target}"
                    edges[node_of(module), node_of(target)].append(where)
    return edges


def cycles(edges: Edges) -> list[list[str]]:
    """Every package cycle: within each strongly connected component of the graph, a shortest
    cycle through each of its nodes (a, b, ..., a), each cycle once, sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    found: set[tuple[str, ...]] = set()
    for component in _components(graph):
        for start in component:
            ring = _shortest_cycle(start, set(component), graph)
            turn = ring.index(min(ring))
            found.add((*ring[turn:], *ring[:turn]))
    return sorted([*ring, ring[0]] for ring in found)


def _components(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _shortest_cycle(start: str, inside: set[str], graph: Mapping[str, set[str]]) -> list[str]:
    """The nodes of a shortest cycle from ``start`` back to it, within ``inside``."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph.get(v, set()) & inside):
            if w == start:
                return paths[v]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def _describe(cycle: list[str], edges: Edges) -> str:
    steps = [f"  {a} -> {b}: {edges[a, b][0]}" + (f" (+{len(edges[a, b]) - 1} more)"
                                                    if len(edges[a, b]) > 1 else "")
             for a, b in pairwise(cycle)]
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def layer_of() -> dict[str, int]:
    return {node: i for i, (_, nodes) in enumerate(LAYERS) for node in nodes}


def upward(edges: Edges, layers: Mapping[str, int]) -> list[str]:
    names = [name for name, _ in LAYERS]
    return [f"{a} ({names[layers[a]]}) imports {b} ({names[layers[b]]}): {where[0]}"
            for (a, b), where in sorted(edges.items())
            if a in layers and b in layers and layers[b] > layers[a]]


def test_no_package_imports_another_that_imports_it_back() -> None:
    edges = module_edges()
    found = cycles(edges)
    assert not found, "package import cycles:\n" + "\n".join(_describe(c, edges) for c in found)


def test_every_import_goes_down_the_layers() -> None:
    edges = module_edges()
    layers = layer_of()
    unplaced = sorted({node_of(m) for m in _modules()} - set(layers))
    assert not unplaced, f"place these in LAYERS (tests/test_import_graph.py): {unplaced}"
    bad = upward(edges, layers)
    assert not bad, "imports of a layer above:\n" + "\n".join(bad)


def test_the_walk_sees_the_whole_tree() -> None:
    """A walk that missed the folders, or the relative imports, would pass the tests above."""
    edges = module_edges()
    nodes = {n for pair in edges for n in pair}
    assert {"doctor.analyse", "doctor.rules", "doctor.record", "doctor.store", "doctor.probes",
            "doctor.reports", "doctor.trace", "doctor.verdict"} <= nodes
    # relative imports (probes/ runs in the job as a private package) are resolved
    assert any("probes/" in w and "doctor.record" in w
               for w in edges.get(("doctor.probes", "doctor.record"), []))
    assert set(layer_of()) >= set(LAYERS[0][1])


def test_the_folders_are_the_packages_pyproject_installs() -> None:
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {v: k for k, v in config["package-dir"].items()} == FOLDERS


@pytest.mark.parametrize(("edges", "expected"), [
    ({("a", "b"): ["x"], ("b", "a"): ["y"]}, [["a", "b", "a"]]),
    ({("a", "b"): ["x"], ("b", "a"): ["y"], ("c", "b"): ["z"], ("b", "c"): ["w"]},
     [["a", "b", "a"], ["b", "c", "b"]]),
    ({("a", "b"): ["x"], ("b", "c"): ["y"], ("c", "a"): ["z"], ("c", "d"): ["w"]},
     [["a", "b", "c", "a"]]),
    ({("a", "b"): ["x"], ("b", "c"): ["y"]}, []),
])
def test_a_cycle_is_named(edges: Edges, expected: list[list[str]]) -> None:
    assert cycles(edges) == expected
