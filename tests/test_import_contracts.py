"""The import contracts of pyproject.toml ([tool.importlinter], run by scripts/lint_imports.py, `make
lint` and CI): the tree keeps them, and an upward import or a circle breaks them (issue 55)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = ROOT / "scripts" / "lint_imports.py"


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(LINT), "--root", str(root)], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the checkout's Python files and pyproject.toml, as lint_imports.py reads them."""
    for folder in ("agentrl", "envs", "tools", "sandboxes"):
        for path in (ROOT / folder).rglob("*.py"):
            out = tmp_path / path.relative_to(ROOT)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out)
    shutil.copyfile(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_its_import_contracts() -> None:
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "BROKEN" not in out.stdout and "Contracts: 4 kept, 0 broken" in out.stdout, out.stdout[-2000:]


def test_an_upward_import_breaks_the_layers_contract(tree: Path) -> None:
    """The base layer (types) importing the train command: named, with the line, and exit 1."""
    types = tree / "agentrl" / "types.py"
    types.write_text(types.read_text() + "\n\nimport agentrl.run  # deliberately upward\n")
    out = lint(tree)
    assert out.returncode != 0
    assert "agentrl.types is not allowed to import agentrl.run" in out.stdout, out.stdout[-3000:]


def test_a_circle_inside_a_package_breaks_the_contracts(tree: Path) -> None:
    """The swe env's package-source module importing its env back: a circle and an upward import."""
    source = tree / "envs" / "swe" / "source.py"
    source.write_text(source.read_text() + "\n\ndef _env() -> object:\n    from .env import SWEEnv\n\n"
                      "    return SWEEnv\n")
    out = lint(tree)
    assert out.returncode != 0
    assert "agentrl.envs.swe.source is not allowed to import agentrl.envs.swe.env" in out.stdout, out.stdout[-3000:]
    assert "No cycles are allowed in agentrl.envs.swe" in out.stdout, out.stdout[-3000:]


def _code_figures():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import code_figures
    finally:
        sys.path.pop(0)
    return code_figures


def test_every_import_inside_a_function_says_why() -> None:
    """An import inside a function body is for an optional dependency or a heavy lazy load, and a
    comment on it (or just above its block) says which."""
    figures, _ = _code_figures().figures(ROOT)
    assert figures["imports_in_functions_without_a_reason"] == []


def test_an_unexplained_import_inside_a_function_is_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import json\n\n    return json\n\n\n"
                      "def g():\n    # optional: the ray extra\n    import ray\n    from ray import util\n\n    return ray, util\n\n\n"
                      "def h():\n    import torch  # heavy lazy load\n    return torch\n")
    figures = _code_figures()
    lines = figures.imports_in_functions(module)
    assert lines == [2, 9, 10, 16] and figures.unexplained(module, lines) == [2]
