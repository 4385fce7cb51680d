"""Laminar's modules import down, never in a circle, and the package loads nothing heavy (issue 55)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

LAMINAR = Path(__file__).resolve().parents[2] / "agentrl" / "laminar"
# what a function body may import: optional third-party dependencies (the `ray` extra)
OPTIONAL = {"ray", "cloudpickle"}


def _imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """(module imported, inside a function body) for every import statement."""
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                out.extend((a.name, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module:
                out.extend([(child.module, in_function)])
            visit(child, inner)

    visit(tree, False)
    return out


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in LAMINAR.glob("*.py"):
        mods = {m.removeprefix("agentrl.laminar.") for m, _ in _imports(ast.parse(path.read_text()))
                if m.startswith("agentrl.laminar.")}
        graph[path.stem] = mods
    return graph


def test_laminar_modules_import_each_other_without_a_circle() -> None:
    graph = _graph()
    assert {"types", "runtime", "loop", "worker", "manager", "cluster"} <= set(graph)
    done: set[str] = set()

    def walk(mod: str, path: list[str]) -> None:
        assert mod not in path, f"import circle: {' -> '.join([*path, mod])}"
        if mod in done:
            return
        for dep in graph.get(mod, ()):
            walk(dep, [*path, mod])
        done.add(mod)

    for mod in graph:
        walk(mod, [])
    # the records every component shares, and the runtime, import no other component
    assert graph["types"] == set() and graph["runtime"] == set()


def test_no_laminar_imports_inside_functions_but_optional_dependencies() -> None:
    inside = {(path.name, m) for path in LAMINAR.glob("*.py")
              for m, in_function in _imports(ast.parse(path.read_text()))
              if in_function and m.split(".")[0] not in OPTIONAL}
    assert inside == set()


@pytest.mark.parametrize("module", ["agentrl.laminar", "agentrl.laminar.prompts", "agentrl.laminar.buffer",
                                    "agentrl.laminar.manager", "agentrl.laminar.types"])
def test_importing_the_package_and_its_light_modules_does_not_load_torch(module: str) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules, 'agentrl.laminar.loop' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_package_still_names_every_component() -> None:
    import agentrl.laminar as laminar
    from agentrl.laminar.loop import run_training
    from agentrl.laminar.prompts import GroupSpec

    assert laminar.run_training is run_training and laminar.GroupSpec is GroupSpec
    assert all(getattr(laminar, name) is not None for name in laminar.__all__)
    with pytest.raises(AttributeError):
        laminar.no_such_name  # noqa: B018
