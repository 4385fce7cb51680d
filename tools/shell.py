"""`python` and `bash`: run code in the episode's sandbox (architecture.md §4, §5).

A non-zero exit status is a normal result the model should read (a traceback, a failing test),
so it is reported in the output; a sandbox fault (a timeout, out of memory, a full disk, the
process limit: `ExecResult.fault`) or a sandbox failure is a tool error naming its kind.
"""

from __future__ import annotations

from typing import Any

from agentrl.sandboxes.base import ExecResult
from agentrl.sandboxes.common import FAULT_DISK_FULL, FAULT_OOM, FAULT_PIDS, FAULT_TIMEOUT
from agentrl.tools.core import ToolResult, tool

# What the model reads when a command ran into a sandbox limit (ExecResult.fault), after its output.
FAULT_MESSAGES = {
    FAULT_OOM: "out of memory: the sandbox's memory limit killed the program or refused it memory; use less memory",
    FAULT_DISK_FULL: "no space left on device: /work or /tmp is full (the sandbox's disk limit); delete files "
                     "or write less",
    FAULT_PIDS: "process limit reached: the sandbox refused a new process or thread; start fewer of them",
}


def fault_error(fault: str, timeout: float) -> str:
    """The error line naming a sandbox fault, e.g. `sandbox fault (oom): out of memory: ...`."""
    if fault == FAULT_TIMEOUT:
        return f"sandbox fault ({fault}): timed out after {timeout:g} s; the process was killed"
    return f"sandbox fault ({fault}): {FAULT_MESSAGES.get(fault, fault)}"


def exec_result(result: ExecResult, timeout: float) -> ToolResult:
    """Merge stdout and stderr into what the model reads, with the exit status, and a timeout or
    another sandbox fault as the error."""
    text = result.stdout
    if result.stderr:
        text += ("" if not text or text.endswith("\n") else "\n") + result.stderr
    text = text.rstrip("\n")
    if result.truncated:
        text += "\n[output cut off by the sandbox's output limit]"
    fault = result.fault or (FAULT_TIMEOUT if result.timed_out else None)
    if result.exit_code != 0 and not result.timed_out:
        text += f"\n[exit code {result.exit_code}]"
    if fault is not None:
        error = fault_error(fault, timeout)
        if result.timed_out and fault != FAULT_TIMEOUT:
            error += f"; it was killed at the {timeout:g} s timeout"
        return ToolResult(text, error=error, fault=fault)
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
