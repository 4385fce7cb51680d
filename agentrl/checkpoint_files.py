"""Where a run keeps its checkpoints on disk: `<run dir>/checkpoints/step_<N>.pt`. Names only, no
torch, so the commands that look for a checkpoint (`train --resume`, `eval`, `serve`) can check a
run directory before they load anything heavy."""

from __future__ import annotations

import os
import re
from pathlib import Path

_NAME = re.compile(r"step_(\d+)\.pt")


def checkpoint_name(step: int) -> str:
    return f"step_{step}.pt"


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The checkpoint with the highest step in `directory`, or None."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.fullmatch(p.name))]
    return max(found)[1] if found else None
