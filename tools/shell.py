"""`python` and `bash`: run code in the episode's sandbox (design §4, §5).

A non-zero exit status is a normal result the model should read (a traceback, a failing test),
so it is reported in the output; only a timeout (the sandbox kills the process group) or a
sandbox failure is a tool error.
"""

from __future__ import annotations

from typing import Any

from agentrl.sandboxes.base import ExecResult
from agentrl.tools.core import ToolResult, tool


def exec_result(result: ExecResult, timeout: float) -> ToolResult:
    """Merge stdout and stderr into what the model reads, with the exit status and a timeout."""
    text = result.stdout
    if result.stderr:
        text += ("" if not text or text.endswith("\n") else "\n") + result.stderr
    text = text.rstrip("\n")
    if result.truncated:
        text += "\n[output cut off by the sandbox's output limit]"
    if result.timed_out:
        return ToolResult(text, error=f"timed out after {timeout:g} s; the process was killed")
    if result.exit_code != 0:
        text += f"\n[exit code {result.exit_code}]"
    return ToolResult(text.strip("\n") or "(no output)")


@tool(inject=("sandbox", "timeout"))
async def python(code: str, sandbox: Any, timeout: float) -> ToolResult:
    """Run a Python program with python3 in the sandbox and return what it prints.

    Args:
        code: the complete Python source to run; print what you want to see
    """
    # The program comes on stdin, so nothing is left behind in the work dir.
    result = await sandbox.exec(["python3", "-"], timeout=timeout, stdin=code)
    return exec_result(result, timeout)


@tool(inject=("sandbox", "timeout"))
async def bash(command: str, sandbox: Any, timeout: float) -> ToolResult:
    """Run a bash command in the sandbox's work dir and return its output.

    Args:
        command: the command line, e.g. "ls -la" or "python -m pytest -q"
    """
    result = await sandbox.exec(["bash", "-c", command], timeout=timeout)
    return exec_result(result, timeout)
