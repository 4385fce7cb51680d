"""`submit`: the terminal tool. It records the answer in the episode state, where `reward` reads it."""

from __future__ import annotations

from typing import Any

from agentrl.tools.core import state_set, tool


@tool(terminal=True, inject=("state",))
async def submit(answer: str = "", state: Any = None) -> str:
    """Finish the task and submit your final answer. Call it once, when you are done.

    Args:
        answer: your final answer (leave it empty if the task needs none)
    """
    state_set(state, "answer", answer)
    state_set(state, "submitted", True)
    return "Submitted."
