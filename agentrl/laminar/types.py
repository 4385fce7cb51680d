"""The records Laminar's components pass to each other (architecture.md §9): a prompt group to generate,
an in-flight trajectory's entry, a worker's heartbeat, a trajectory in transit during a repack.
Plain dataclasses with no behaviour beyond their own fields, so every component (and the
simulator in bench/laminar_sim.py) can import them without importing another component."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.types import Task

FetchPolicy = Literal["wait_inflight", "local"]
"""How a worker fetches weights: wait for a version announced but still in flight, or take the
relay's complete one now."""


@dataclass(frozen=True)
class GroupSpec:
    """One prompt group to generate: G trajectories `{group_id}/{i}` of one task."""

    group_id: str
    task: Task
    size: int

    @property
    def traj_ids(self) -> list[str]:
        return [f"{self.group_id}/{i}" for i in range(self.size)]


@dataclass
class PartialEntry:
    """Where one in-flight trajectory is (its worker and weight version) and how far it got."""

    traj_id: str
    group_id: str
    group_size: int
    task: Task
    worker: str
    version: int
    tokens: int = 0
    restarts: int = 0
    updated: float = field(default_factory=time.monotonic)


@dataclass
class WorkerLoad:
    """One heartbeat: the capacity indicators of Algorithm 1 plus bookkeeping."""

    worker: str
    version: int
    n_reqs: int
    tokens: int
    c_used: float
    c_peak: float  # highest c_used since this batch started (the plateau); see manager
    pulling: bool
    held: bool
    time: float
    c_prev: float = 0.0  # c_used at the previous heartbeat


@dataclass
class Moved:
    """A trajectory in transit between workers during a repack."""

    traj_id: str
    group_id: str
    group_size: int
    task: Task
    state: Any
