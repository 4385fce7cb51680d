"""Docstring → (tool description, parameter descriptions), for Google, NumPy and Sphinx styles.

The model sees a tool's summary and one line per parameter, so only those two things are
extracted; return/raises sections are dropped.
"""

from __future__ import annotations

import inspect
import re

_GOOGLE_HEADERS = {"args:", "arguments:", "parameters:", "params:", "keyword args:", "keyword arguments:"}
_SPHINX_RE = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_GOOGLE_ITEM_RE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_ITEM_RE = re.compile(r"^(\*{0,2}\w+)\s*(?::.*)?$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Return the summary (text before the first section) and {param: description}."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    params: dict[str, str] = {}
    summary: list[str] = []
    i, in_summary = 0, True
    while i < len(lines):
        line, stripped = lines[i], lines[i].strip()
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if _SPHINX_RE.match(line):
            i = _read_sphinx(lines, i, params)
            in_summary = False
        elif stripped.lower() in _GOOGLE_HEADERS:
            i = _read_google(lines, i + 1, params)
            in_summary = False
        elif stripped.lower() in ("parameters", "other parameters") and re.fullmatch(r"-{3,}", nxt):
            i = _read_numpy(lines, i + 2, params)
            in_summary = False
        elif _is_section(line, nxt) or stripped.startswith(":"):
            in_summary = False
            i += 1
        else:
            if in_summary:
                summary.append(stripped)
            i += 1
    return " ".join(" ".join(summary).split()), params


def _is_section(line: str, nxt: str) -> bool:
    """A Google header (`Returns:`) or a NumPy header (`Returns` over a dashed rule)."""
    stripped = line.strip()
    google = bool(re.fullmatch(r"[A-Z][A-Za-z ]*:", stripped)) and not line.startswith(" ")
    numpy = bool(re.fullmatch(r"[A-Z][A-Za-z ]*", stripped)) and bool(re.fullmatch(r"-{3,}", nxt))
    return google or numpy


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _read_google(lines: list[str], i: int, params: dict[str, str]) -> int:
    """`name (type): text` items, continuation lines indented deeper; ends at a dedent."""
    base: int | None = None
    current: str | None = None
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if base is None:
            base = _indent(line)
            if base == 0:
                return i
        if _indent(line) < base:
            return i
        match = _GOOGLE_ITEM_RE.match(line.strip()) if _indent(line) == base else None
        if match:
            current = match.group(1).lstrip("*")
            params[current] = match.group(2).strip()
        elif current is not None:
            params[current] = (params[current] + " " + line.strip()).strip()
        i += 1
    return i


def _read_numpy(lines: list[str], i: int, params: dict[str, str]) -> int:
    """`name : type` lines at column 0 with indented description lines; ends at the next header."""
    current: str | None = None
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if not line.strip():
            i += 1
            continue
        if _indent(line) == 0 and re.fullmatch(r"-{3,}", nxt):
            return i  # next section
        if _indent(line) == 0:
            match = _NUMPY_ITEM_RE.match(line.strip())
            if not match:
                return i
            current = match.group(1).lstrip("*")
            params[current] = ""
        elif current is not None:
            params[current] = (params[current] + " " + line.strip()).strip()
        i += 1
    return i


def _read_sphinx(lines: list[str], i: int, params: dict[str, str]) -> int:
    """One `:param [type] name: text` field plus its indented continuation lines."""
    match = _SPHINX_RE.match(lines[i])
    assert match is not None
    name, text = match.group(1), match.group(2).strip()
    i += 1
    while i < len(lines) and lines[i].strip() and _indent(lines[i]) > 0 and not lines[i].strip().startswith(":"):
        text = (text + " " + lines[i].strip()).strip()
        i += 1
    params[name] = text
    return i
