#!/usr/bin/env python3
"""The code's size in figures, one JSON line: lines in agentrl/, its largest module, the imports
that sit inside function bodies (in agentrl/, envs/, tools/, sandboxes/) and the config's leaf fields.

    python scripts/code_figures.py            # the figures
    python scripts/code_figures.py --list     # and every import inside a function, file:line

An import inside a function is allowed for an optional dependency or a heavy lazy load, with a
comment saying which (tests/test_import_contracts.py checks that each has one); this counts them
all so a change can show the number going down.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agentrl", "envs", "tools", "sandboxes")


def imports_in_functions(path: Path) -> list[int]:
    """Line numbers of the import statements inside a def (at any depth) in one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines: list[int] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                lines.append(child.lineno)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return lines


def _is_import(line: str) -> bool:
    return line.startswith("import ") or (line.startswith("from ") and " import " in line)


def unexplained(path: Path, lines: list[int]) -> list[int]:
    """Of the in-function imports at `lines`, those with no reason: no comment on their own line,
    on another import of their block (consecutive imports, blank lines between), or on the line
    just above the block."""
    text = path.read_text().splitlines()
    out = []
    for n in lines:
        first = last = n - 1  # 0-based bounds of the block
        while first > 0 and (_is_import(text[first - 1].strip()) or not text[first - 1].strip()):
            first -= 1
        while last + 1 < len(text) and (_is_import(text[last + 1].strip()) or not text[last + 1].strip()):
            last += 1
        block = [line for line in text[first:last + 1] if line.strip()]
        above = text[first - 1].strip() if first > 0 else ""
        if not above.startswith("#") and not any("#" in line for line in block):
            out.append(n)
    return out


def config_leaf_fields(path: Path) -> int:
    """Leaf fields of the config's dataclasses: annotated class fields whose type is not another
    dataclass of the same module (those are sections, counted through their own fields)."""
    tree = ast.parse(path.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    leaves = 0
    for cls in classes.values():
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                annotation = ast.unparse(stmt.annotation).strip("'\"")
                if annotation not in classes:
                    leaves += 1
    return leaves


def figures(root: Path = ROOT) -> tuple[dict, list[str]]:
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines())
             for p in sorted((root / "agentrl").rglob("*.py"))}
    largest = max(sizes, key=sizes.get)
    inside: list[str] = []
    no_reason: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            lines = imports_in_functions(path)
            inside += [f"{path.relative_to(root)}:{line}" for line in lines]
            no_reason += [f"{path.relative_to(root)}:{line}" for line in unexplained(path, lines)]
    return {
        "agentrl_lines": sum(sizes.values()),
        "agentrl_modules": len(sizes),
        "largest_module": largest,
        "largest_module_lines": sizes[largest],
        "imports_in_functions": len(inside),
        "imports_in_functions_without_a_reason": no_reason,
        "config_leaf_fields": config_leaf_fields(root / "agentrl" / "config.py"),
    }, inside


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list every import inside a function")
    args = parser.parse_args(argv)
    result, inside = figures()
    if args.list:
        print("\n".join(inside))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
