"""`str_replace_editor`: view, create and edit files in the sandbox (the SWE-agent / Anthropic editor).

Commands: view (a file with line numbers, or a directory listing), create (a new file),
str_replace (replace one unique occurrence), insert (after a line), undo_edit (revert the last
edit of a file). Paths are relative to the sandbox work dir. The undo history lives in the
episode state (key "editor_history"), so it ends with the episode.
"""

from __future__ import annotations

from typing import Any, Literal

from agentrl.tools.core import ToolResult, state_get, state_set, tool

SNIPPET_LINES = 4  # context shown around an edit
_KIND_SCRIPT = 'if [ -d "$1" ]; then echo dir; elif [ -f "$1" ]; then echo file; elif [ -e "$1" ]; then echo other; fi'


def numbered(text: str, first: int = 1) -> str:
    """`cat -n` style: right-aligned line numbers, a tab, the line."""
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.split("\n"), first))


def _snippet(content: str, line: int, extra: int = 0) -> str:
    """Numbered lines around 0-based `line` (plus `extra` lines of the edit itself)."""
    lines = content.split("\n")
    start = max(0, line - SNIPPET_LINES)
    end = min(len(lines), line + extra + SNIPPET_LINES + 1)
    return numbered("\n".join(lines[start:end]), start + 1)


class _Fail(Exception):
    """An editor error the model should read."""


class _Editor:
    def __init__(self, sandbox: Any, state: Any, timeout: float) -> None:
        self.sandbox, self.state, self.timeout = sandbox, state, timeout

    async def kind(self, path: str) -> str:
        """"dir", "file", "other" or "missing", in one exec (each exec costs a process start)."""
        result = await self.sandbox.exec(["sh", "-c", _KIND_SCRIPT, "sh", path], timeout=self.timeout)
        return result.stdout.strip() or "missing"

    async def read(self, path: str, kind: str | None = None) -> str:
        kind = kind or await self.kind(path)
        if kind == "dir":
            raise _Fail(f"{path} is a directory; view it, or give a file path")
        if kind != "file":
            raise _Fail(f"{path} does not exist (use the create command for a new file)")
        return (await self.sandbox.read_file(path)).decode("utf-8", errors="replace")

    async def write(self, path: str, content: str, previous: str | None) -> None:
        await self.sandbox.write_file(path, content)
        history = state_get(self.state, "editor_history")
        if history is None:
            history = {}
            state_set(self.state, "editor_history", history)
        history.setdefault(path, []).append(previous)

    async def view(self, path: str, view_range: list[int] | None) -> str:
        kind = await self.kind(path)
        if kind == "dir":
            if view_range is not None:
                raise _Fail("view_range applies to files, not directories")
            listing = await self.sandbox.exec(["find", path, "-maxdepth", "2", "-not", "-path", "*/.*"],
                                              timeout=self.timeout)
            entries = sorted(listing.stdout.split("\n"))
            return f"Files and directories up to 2 levels deep in {path}:\n" + "\n".join(e for e in entries if e)
        content = await self.read(path, kind)
        lines = content.split("\n")
        if view_range is None:
            return numbered(content)
        if len(view_range) != 2:
            raise _Fail(f"view_range must be [start, end], got {view_range}")
        start, end = view_range
        end = len(lines) if end == -1 else end
        if not 1 <= start <= len(lines) or not start <= end <= len(lines):
            raise _Fail(f"view_range {view_range} is outside the file's lines 1..{len(lines)} "
                        "(end may be -1 for the last line)")
        return numbered("\n".join(lines[start - 1: end]), start)

    async def create(self, path: str, file_text: str | None) -> str:
        if file_text is None:
            raise _Fail("create needs file_text")
        if await self.kind(path) != "missing":
            raise _Fail(f"{path} already exists; edit it with str_replace or insert")
        await self.write(path, file_text, None)
        return f"Created {path}."

    async def str_replace(self, path: str, old_str: str | None, new_str: str | None) -> str:
        if old_str is None or old_str == "":
            raise _Fail("str_replace needs a non-empty old_str")
        content = await self.read(path)
        count = content.count(old_str)
        if count == 0:
            raise _Fail(f"old_str was not found verbatim in {path} (check whitespace and indentation)")
        if count > 1:
            lines = [content[: i].count("\n") + 1 for i in _find_all(content, old_str)]
            raise _Fail(f"old_str occurs {count} times in {path} (lines {lines}); make it unique")
        new_str = new_str or ""
        at = content.index(old_str)
        updated = content[:at] + new_str + content[at + len(old_str):]
        await self.write(path, updated, content)
        line = content[:at].count("\n")
        return f"Edited {path}. The lines around the change:\n{_snippet(updated, line, new_str.count(chr(10)))}"

    async def insert(self, path: str, insert_line: int | None, new_str: str | None) -> str:
        if insert_line is None or new_str is None:
            raise _Fail("insert needs insert_line and new_str")
        content = await self.read(path)
        lines = content.split("\n")
        if not 0 <= insert_line <= len(lines):
            raise _Fail(f"insert_line must be between 0 and {len(lines)} (the file's line count), got {insert_line}")
        updated = "\n".join(lines[:insert_line] + new_str.split("\n") + lines[insert_line:])
        await self.write(path, updated, content)
        return (f"Inserted after line {insert_line} of {path}:\n"
                f"{_snippet(updated, insert_line, new_str.count(chr(10)))}")

    async def undo_edit(self, path: str) -> str:
        history = state_get(self.state, "editor_history") or {}
        if not history.get(path):
            raise _Fail(f"there is no edit of {path} to undo")
        previous = history[path].pop()
        if previous is None:  # undo a create
            await self.sandbox.exec(["rm", "-f", path], timeout=self.timeout)
            return f"Undid the creation of {path}; the file is gone."
        await self.sandbox.write_file(path, previous)
        return f"Undid the last edit of {path}. It now reads:\n{numbered(previous)}"


def _find_all(text: str, sub: str) -> list[int]:
    out, i = [], text.find(sub)
    while i >= 0:
        out.append(i)
        i = text.find(sub, i + 1)
    return out


@tool(inject=("sandbox", "state", "timeout"))
async def str_replace_editor(
    command: Literal["view", "create", "str_replace", "insert", "undo_edit"],
    path: str,
    file_text: str | None = None,
    old_str: str | None = None,
    new_str: str | None = None,
    insert_line: int | None = None,
    view_range: list[int] | None = None,
    sandbox: Any = None,
    state: Any = None,
    timeout: float = 10.0,
) -> ToolResult:
    """View, create and edit files.

    Args:
        command: view, create, str_replace, insert or undo_edit
        path: file or directory path, relative to the work dir
        file_text: the content of the new file (create)
        old_str: the exact text to replace; it must occur exactly once (str_replace)
        new_str: the replacement (str_replace) or the text to insert (insert)
        insert_line: insert new_str after this line; 0 inserts at the top (insert)
        view_range: [start, end] lines to show, 1-based, end -1 for the last line (view)
    """
    if not path.strip():
        return ToolResult(error="argument 'path' is empty")
    editor = _Editor(sandbox, state, timeout)
    try:
        if command == "view":
            return ToolResult(await editor.view(path, view_range))
        if command == "create":
            return ToolResult(await editor.create(path, file_text))
        if command == "str_replace":
            return ToolResult(await editor.str_replace(path, old_str, new_str))
        if command == "insert":
            return ToolResult(await editor.insert(path, insert_line, new_str))
        return ToolResult(await editor.undo_edit(path))
    except _Fail as e:
        return ToolResult(error=str(e))
