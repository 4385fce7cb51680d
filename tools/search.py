"""`search`: query a retriever the env supplies (any object with `search(query, k)`, sync or async,
returning hits with id/title/text as attributes or dict keys)."""

from __future__ import annotations

import inspect
from typing import Any

from agentrl.tools.core import ToolResult, tool

MAX_K = 20
SNIPPET_CHARS = 300


def _field(hit: Any, key: str) -> str:
    value = hit.get(key) if isinstance(hit, dict) else getattr(hit, key, None)
    return "" if value is None else str(value)


def format_hits(hits: list[Any]) -> str:
    """One numbered entry per hit: id, title and a snippet of the text (a plain string hit is the text)."""
    if not hits:
        return "No results."
    entries = []
    for i, hit in enumerate(hits, 1):
        text = " ".join((hit if isinstance(hit, str) else _field(hit, "text")).split())
        if len(text) > SNIPPET_CHARS:
            text = text[: SNIPPET_CHARS - 3] + "..."
        doc_id, title = ("", "") if isinstance(hit, str) else (_field(hit, "id"), _field(hit, "title"))
        head = " ".join(s for s in (f"[{i}]", f"id={doc_id}" if doc_id else "", title) if s)
        entries.append(f"{head}\n{text}" if text else head)
    return "\n\n".join(entries)


@tool(inject=("retriever",))
async def search(query: str, k: int = 5, retriever: Any = None) -> ToolResult:
    """Search the document collection and return the best matches with their ids.

    Args:
        query: what to look for, in a few words
        k: how many results to return (1 to 20)
    """
    if not 1 <= k <= MAX_K:
        return ToolResult(error=f"argument 'k' must be between 1 and {MAX_K}, got {k}")
    if not query.strip():
        return ToolResult(error="argument 'query' is empty")
    hits = retriever.search(query, k)
    if inspect.isawaitable(hits):
        hits = await hits
    return ToolResult(format_hits(list(hits)))
