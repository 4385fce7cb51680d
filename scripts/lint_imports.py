#!/usr/bin/env python3
"""Check the import contracts of pyproject.toml's [tool.importlinter] (import-linter) against the
package as it installs.

    python scripts/lint_imports.py               # this checkout; exit 1 on a broken contract
    python scripts/lint_imports.py --root DIR    # another copy of the tree (tests/test_layers.py)

Why a wrapper: the wheel maps the top-level folders envs/, tools/ and sandboxes/ into the package as
agentrl.envs, agentrl.tools and agentrl.sandboxes (pyproject's package-dir), and grimp, which reads
a package from its folder, would not see them. So the .py files are laid out as they install, in a
temporary folder, and lint-imports runs on that copy.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# folder in the checkout -> where it sits in the installed package
LAYOUT = {"agentrl": "agentrl", "envs": "agentrl/envs", "tools": "agentrl/tools", "sandboxes": "agentrl/sandboxes"}


def installed_layout(root: Path, dest: Path) -> Path:
    """Copy the tree's .py files under `dest` as the wheel lays them out; returns `dest`."""
    for folder, target in LAYOUT.items():
        for path in (root / folder).rglob("*.py"):
            out = dest / target / path.relative_to(root / folder)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out)
    return dest


def lint(root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    if not lint_imports.exists():
        found = shutil.which("lint-imports")
        if found is None:
            raise SystemExit("lint-imports is not installed: pip install import-linter (the dev extra has it)")
        lint_imports = Path(found)
    with tempfile.TemporaryDirectory(prefix="agentrl-layers-") as tmp:
        installed_layout(root, Path(tmp))
        env = {**os.environ, "PYTHONPATH": tmp}  # the copy, not the editable install, is `agentrl`
        return subprocess.run([str(lint_imports), str(root / "pyproject.toml"), "--no-cache"],
                              cwd=tmp, env=env, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to check (default: this checkout)")
    args = parser.parse_args(argv)
    result = lint(args.root.resolve())
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
