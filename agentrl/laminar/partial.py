"""Partial-response pool: where every in-flight trajectory is and how far it got.

Laminar (arXiv 2510.12633) §3.1 and §4.3; algorithms.md §1.6. Workers register a trajectory
when they start it, stream its token count as it grows, and close it when it reaches the
experience buffer. When a worker dies, the manager reads its entries here and restarts them.
"""

from __future__ import annotations

import time
from typing import Any

from agentrl.laminar.types import PartialEntry

__all__ = ["PartialEntry", "PartialResponsePool"]


class PartialResponsePool:
    def __init__(self) -> None:
        self.entries: dict[str, PartialEntry] = {}
        self.closed = 0

    async def open(self, entries: list[PartialEntry]) -> None:
        for e in entries:
            old = self.entries.get(e.traj_id)
            if old is not None:  # a restart keeps the count of earlier attempts
                e.restarts = old.restarts + 1
            self.entries[e.traj_id] = e

    async def progress(self, traj_id: str, tokens: int) -> None:
        e = self.entries.get(traj_id)
        if e is not None:
            e.tokens, e.updated = tokens, time.monotonic()

    async def move(self, traj_ids: list[str], worker: str) -> None:
        for t in traj_ids:
            if t in self.entries:
                self.entries[t].worker = worker

    async def close(self, traj_id: str) -> None:
        if self.entries.pop(traj_id, None) is not None:
            self.closed += 1

    async def of_worker(self, worker: str) -> list[PartialEntry]:
        return [e for e in self.entries.values() if e.worker == worker]

    async def stats(self) -> dict[str, Any]:
        return {"in_flight": len(self.entries), "closed": self.closed,
                "tokens_in_flight": sum(e.tokens for e in self.entries.values())}
