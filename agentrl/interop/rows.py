"""Task rows from a JSONL file, as the adapters that take a dataset read them (trl:, openenv:).

    rows = read_rows("rows.jsonl", option="env.kwargs.tasks", scheme="trl")
    test = [r for i, r in enumerate(rows) if held_out(i)]   # every fifth row: 4, 9, ...
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.config import ConfigError

TEST_EVERY = 5  # without a held-out file, rows 4, 9, 14, ... are the held-out split


def held_out(index: int) -> bool:
    """Whether row `index` of a file with no held-out file of its own belongs to the test split."""
    return index % TEST_EVERY == TEST_EVERY - 1


def read_rows(path: str, *, option: str, scheme: str) -> list[dict[str, Any]]:
    """One JSON object per non-empty line; ConfigError (one line) naming the file, the line and
    the option that named the file."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{scheme}: {option}: no such file {path} (a JSONL of rows, one JSON object per line)")
    rows = []
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{scheme}: {option}: {path}:{n} is not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{scheme}: {option}: {path}:{n} must be a JSON object (one row), got "
                              f"{type(row).__name__}")
        rows.append(row)
    return rows
