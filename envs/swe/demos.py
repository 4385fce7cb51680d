"""Demonstrations of the `swe` env (issue 13): run the failing test, view the buggy region,
apply the gold hunks with `str_replace_editor`, run the tests again, submit. Seeded variants
differ in which optional look-ups they make; a variant is shortened to fit `max_turns`
(exploration goes first, then the re-test; the edits and the submit always stay)."""

from __future__ import annotations

import random
import re
import shlex
from collections.abc import Callable

from agentrl.parsing import ToolCall
from agentrl.types import Task

from .grade import hunk_texts, split_patch

_HUNK = re.compile(r"^@@ -(\d+)", re.MULTILINE)


def _hunks(section: str) -> list[tuple[int, str, str]]:
    """(first old line, old text, new text) of each hunk of one file's diff."""
    olds, news = hunk_texts(section)
    starts = [int(m.group(1)) for m in _HUNK.finditer(section)]
    return list(zip(starts, olds, news))


def swe_demonstration(task: Task, format_call: Callable[[ToolCall], str], max_turns: int,
                      seed: int = 0) -> list[str]:
    """The actions of one demonstration of `task` (variant `seed`) in at most `max_turns` turns."""
    rng = random.Random(f"{task['instance_id']}/{seed}")
    tests = list(task.get("FAIL_TO_PASS") or [])
    quoted = " ".join(shlex.quote(t) for t in tests[:3])
    edits, views = [], []
    for path, section in split_patch(task["patch"]):
        for start, old, new in _hunks(section):
            edits.append(format_call(ToolCall("str_replace_editor", {"command": "str_replace", "path": path,
                                                                     "old_str": old, "new_str": new})))
            views.append(format_call(ToolCall("str_replace_editor", {
                "command": "view", "path": path, "view_range": [max(1, start - rng.choice((2, 4))),
                                                                start + len(old.splitlines()) + rng.choice((2, 4))]})))
    run_tests = format_call(ToolCall("bash", {"command": f"python3 -m pytest -q {quoted} 2>&1 | tail -n 5"}))
    first_look = format_call(ToolCall("bash", {"command": rng.choice((
        f"python3 -m pytest -q -x {quoted} 2>&1 | tail -n 15",
        f"python3 -m pytest -q -x --tb=short {quoted} 2>&1 | tail -n 20"))}))
    submit = format_call(ToolCall("submit", {}))
    optional = [[first_look] if seed % 2 == 0 else [], views[:1], [run_tests]]
    while True:
        plan = [*optional[0], *optional[1], *edits, *optional[2], submit]
        if len(plan) <= max_turns or not any(optional):
            break
        next(o for o in optional if o).clear()  # drop the first optional step still there
    if len(plan) > max_turns:  # more hunks than turns: all edits in one turn
        plan = ["\n".join(edits), submit]
    return plan
