"""Demonstrations of the `code` env (issue 13): write the reference solution, run it on the
prompt's example with the python tool, submit it. Seeded variants differ in whether they test
first and in the short thought before each call, so the policy does not learn one fixed string."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from agentrl.parsing import ToolCall
from agentrl.types import Task

_EXAMPLE = re.compile(r">>> (.+)")
_TEST_THOUGHTS = ("", "Let me check the function on the example first.\n", "I will test it on the example.\n",
                  "First, run it once.\n")
_SUBMIT_THOUGHTS = ("", "The output is right, so I submit the function.\n", "It works. Submitting.\n",
                    "Looks correct.\n")


def code_demonstration(task: Task, format_call: Callable[[ToolCall], str], seed: int = 0) -> list[str]:
    """The actions of one demonstration of `task` (variant `seed`), formatted by `format_call`."""
    rng = random.Random(f"{task['id']}/{seed}")
    solution = task["solution"].strip("\n")
    example = _EXAMPLE.search(task.get("prompt", ""))
    actions = []
    if example is not None and seed % 3 != 2:  # two variants in three test before submitting
        code = f"{solution}\n\nprint(repr({example.group(1).strip()}))"
        actions.append(rng.choice(_TEST_THOUGHTS) + format_call(ToolCall("python", {"code": code})))
        actions.append(rng.choice(_SUBMIT_THOUGHTS) + format_call(ToolCall("submit", {"answer": solution})))
    else:
        actions.append(format_call(ToolCall("submit", {"answer": solution})))
    return actions
