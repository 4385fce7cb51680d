"""Partial-response pool: where every in-flight trajectory is and how far it got.

Laminar (arXiv 2510.12633) §3.1 and §4.3; algorithms.md §1.6. Workers register a trajectory
when they start it, stream its token count as it grows, and close it when it reaches the
experience buffer. When a worker dies, the manager reads its entries here and restarts them.

Every call costs O(its own entries): the entries are indexed by worker too, so the manager asking
for a dead worker's does not scan the pool. The progress display reads `stats()` alone, one call a
tick: the pool sums the tokens its trajectories grew by itself (a call per worker per tick was
1,024 calls a second at 1,024 workers, bench/controller.py).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from agentrl.laminar.types import PartialEntry

__all__ = ["PartialEntry", "PartialResponsePool"]


class PartialResponsePool:
    def __init__(self) -> None:
        self.entries: dict[str, PartialEntry] = {}
        self._by_worker: defaultdict[str, dict[str, PartialEntry]] = defaultdict(dict)
        self.closed = 0
        self.tokens_in_flight = 0
        self.tokens_grown = 0  # growth after each trajectory's first report (that one is mostly its prompt)

    async def open(self, entries: list[PartialEntry]) -> None:
        for e in entries:
            old = self._drop(e.traj_id)
            if old is not None:  # a restart keeps the count of earlier attempts
                e.restarts = old.restarts + 1
            self.entries[e.traj_id] = e
            self._by_worker[e.worker][e.traj_id] = e
            self.tokens_in_flight += e.tokens

    async def progress(self, traj_id: str, tokens: int) -> None:
        e = self.entries.get(traj_id)
        if e is not None:
            self.tokens_in_flight += tokens - e.tokens
            if e.tokens:
                self.tokens_grown += max(0, tokens - e.tokens)
            e.tokens, e.updated = tokens, time.monotonic()

    async def move(self, traj_ids: list[str], worker: str) -> None:
        for t in traj_ids:
            e = self.entries.get(t)
            if e is not None:
                self._by_worker[e.worker].pop(t, None)
                e.worker = worker
                self._by_worker[worker][t] = e

    async def close(self, traj_id: str) -> None:
        if self._drop(traj_id) is not None:
            self.closed += 1

    def _drop(self, traj_id: str) -> PartialEntry | None:
        e = self.entries.pop(traj_id, None)
        if e is not None:
            self.tokens_in_flight -= e.tokens
            mine = self._by_worker[e.worker]
            mine.pop(traj_id, None)
            if not mine:
                del self._by_worker[e.worker]
        return e

    async def of_worker(self, worker: str) -> list[PartialEntry]:
        return list(self._by_worker.get(worker, {}).values())

    async def stats(self) -> dict[str, Any]:
        return {"in_flight": len(self.entries), "closed": self.closed, "tokens_in_flight": self.tokens_in_flight,
                "tokens_grown": self.tokens_grown}
