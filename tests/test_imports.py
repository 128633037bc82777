"""keeper's modules import one another without cycles: the graph of module-level imports (inside ``if`` and
``try`` too; ``TYPE_CHECKING`` blocks and imports inside functions left out) has no strongly connected component of
more than one module. Importing ``keeper.a.b`` runs ``keeper.a``'s ``__init__`` first, so that edge counts as well
(except inside the importer's own packages, whose ``__init__`` is already running). Also: ``import keeper`` imports
neither torch nor Ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "keeper"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _extension(package: str, name: str) -> bool:
    """Whether ``package.name`` is a compiled extension (its C source beside the package's modules)."""
    return (ROOT.joinpath(*package.split(".")) / f"{name}.c").is_file()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, body: list[ast.stmt]) -> set[str]:
    """The keeper modules ``body`` imports at module level (inside ``if`` / ``try`` too, not in functions)."""
    out: set[str] = set()
    package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
    for stmt in body:
        if isinstance(stmt, ast.Import):
            out.update(a.name for a in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            if stmt.level:
                base = ".".join(package[:len(package) - stmt.level + 1] + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in stmt.names if f"{base}.{a.name}" in MODULES or _extension(base, a.name)]
            out.update(m for m in subs if m in MODULES)
            # `from pkg import name`: pkg itself, unless every name is a submodule of the importer's own package
            if len(subs) < len(stmt.names) or not (module == base or module.startswith(base + ".")):
                out.add(base)
        elif isinstance(stmt, ast.If):
            out |= _imports(module, stmt.orelse if _is_type_checking(stmt.test) else stmt.body + stmt.orelse)
        elif isinstance(stmt, ast.Try):
            out |= _imports(module, stmt.body + stmt.orelse + stmt.finalbody + [s for h in stmt.handlers
                                                                                  for s in h.body])
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the keeper modules its import runs first."""
    graph = {}
    for module, path in MODULES.items():
        deps = set()
        for dep in _imports(module, ast.parse(path.read_text()).body):
            while dep and dep not in MODULES:  # a name imported from a module: the module
                dep = dep.rpartition(".")[0]
            if not dep or dep == module or not dep.startswith("keeper"):
                continue
            deps.add(dep)
            parts = dep.split(".")
            for i in range(2, len(parts)):  # the packages above it run their __init__ first
                parent = ".".join(parts[:i])
                if not (module == parent or module.startswith(parent + ".")):
                    deps.add(parent)
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and "keeper.warm" in graph["keeper.zoo"], "the graph is read"
    found = cycles(graph)
    assert not found, "import cycles (module -> modules of its cycle it imports): " + "; ".join(
        ", ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in found)


def test_a_cycle_is_found_where_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_importing_keeper_imports_neither_torch_nor_ray():
    code = "import sys, keeper; print('torch' in sys.modules, 'ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def test_a_trial_s_import_leaves_out_what_only_the_service_or_a_transform_needs():
    """``from keeper.tune_integration import warm_start, warm_lr``, what a Tune trial imports, loads neither the
    service's actors and clustering nor the driver's callback, nor the aligner, the transforms or the embedded zoo:
    a trial that starts cold (the first trials on an empty zoo) never needs them, and a warmed one loads them when
    it transforms its parent."""
    left_out = ["keeper.actors.front", "keeper.actors.manager", "keeper.actors.clustering",
                "keeper.tune_integration.callback", "keeper.tune_integration.checkpoint", "keeper.matching",
                "keeper.transforms", "keeper.choice.candidates", "keeper.choice.preservation", "keeper.zoo",
                "kmedoids", "sklearn", "numba"]
    code = ("import sys, json; from keeper.tune_integration import warm_start, warm_lr; "
            f"print(json.dumps([m for m in {left_out!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
