"""The files of this checkout (tracked, and untracked ones git does not ignore), and a copy of some
of them: a build from the copy sees what a clean clone holds, not this tree's build leftovers."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def checkout_files() -> list[str]:
    return subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.split()


def copy_checkout(dest: Path, keep: Callable[[str], bool]) -> list[str]:
    """Copy the checkout's files whose relative path `keep` accepts into `dest`; their paths."""
    copied = [rel for rel in checkout_files() if keep(rel) and (ROOT / rel).is_file()]
    for rel in copied:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return copied
