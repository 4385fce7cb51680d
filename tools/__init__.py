"""Tools (architecture.md §4): `@tool` turns a typed function into a tool; the built-ins run in the sandbox.

    from agentrl.tools import tool, python, bash, str_replace_editor, search, submit
"""

from agentrl.tools.core import Tool, ToolResult, example_arguments, state_get, state_set, tool, truncate
from agentrl.tools.editor import str_replace_editor
from agentrl.tools.schema import ArgumentError
from agentrl.tools.search import search
from agentrl.tools.shell import bash, python
from agentrl.tools.submit import submit

__all__ = [
    "ArgumentError",
    "Tool",
    "ToolResult",
    "bash",
    "example_arguments",
    "python",
    "search",
    "state_get",
    "state_set",
    "str_replace_editor",
    "submit",
    "tool",
    "truncate",
]
