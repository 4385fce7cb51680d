"""Rollout manager: load metrics, Best-Fit repack, worker supervision and fault recovery.

Laminar (arXiv 2510.12633) §3.1, §4.3, §5; algorithms.md §1.4 and §1.6. Deaths are pushed, loads
are pulled: the manager keeps one open `watch` call per worker, which returns (or, for a killed
Ray actor, raises) the moment the worker fails, so a death is handled as it happens with no call
per worker per tick. Every `repack_interval_s`, and right after each weight update, it reads
every worker's load under one deadline (a hung worker misses it and counts as dead), groups the
workers by weight version, runs `best_fit_repack` inside each group and moves every trajectory
of a source to its destination; released sources pull new weights. A dead worker's in-flight trajectories
(from the partial-response pool) restart on a live worker of the same version, or — when none
is left — their whole group is dropped and regenerated, so no group is ever consumed half.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from agentrl.laminar.repack import RolloutLoad, best_fit_repack
from agentrl.laminar.runtime import ActorDied
from agentrl.laminar.types import GroupSpec, PartialEntry, WorkerLoad

IdleRule = Literal["fall", "prev"]


def repack_inputs(loads: list[WorkerLoad], rule: IdleRule = "fall") -> dict[int, list[RolloutLoad]]:
    """Algorithm 1 inputs per weight version, for workers that hold work and stand still.

    [INFERRED] C_prev. `rule="fall"` (default): §1.4 says a rollout counts as idle *from the
    start of the fall* of its KV use, so we pass the batch's plateau (its peak since it took the
    batch) as C_prev: a worker stays a candidate for the whole fall, also while its tail sleeps
    in a tool and its per-check utilisation is flat. `rule="prev"`: the pseudocode literally,
    C_prev = the utilisation at the previous check.
    """
    if rule not in ("fall", "prev"):
        raise ValueError(f"unknown idle rule {rule!r}; expected 'fall' or 'prev'")
    groups: dict[int, list[RolloutLoad]] = defaultdict(list)
    for w in loads:
        if w.n_reqs == 0 or w.pulling or w.held:
            continue
        prev = w.c_peak if rule == "fall" else w.c_prev
        groups[w.version].append(RolloutLoad(w.worker, w.c_used, prev, w.n_reqs))
    return dict(groups)


class RolloutManager:
    def __init__(self, workers: dict[str, Any], *, buffer: Any, prompts: Any, partial: Any,
                 c_max: float = 0.99, max_batch: int = 64, repack_interval_s: float = 5.0,
                 heartbeat_timeout_s: float = 30.0, idle_rule: IdleRule = "fall",
                 on_dead: Callable[[Any], Awaitable[None]] | None = None) -> None:
        if repack_interval_s <= 0:
            raise ValueError("repack_interval_s must be > 0")
        self.workers = dict(workers)
        self.buffer, self.prompts, self.partial = buffer, prompts, partial
        self.c_max, self.max_batch = c_max, max_batch
        self.repack_interval_s = repack_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.on_dead = on_dead
        self.idle_rule = idle_rule
        self._trigger = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watches: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()
        self.loads: dict[str, WorkerLoad] = {}
        self.dead: list[str] = []
        self.failures: dict[str, str] = {}  # dead worker -> why
        self.stats: dict[str, Any] = {"repack_rounds": 0, "repack_plans": 0, "repack_moves": 0,
                                      "repack_s": 0.0, "restarted": 0, "regenerated_groups": 0,
                                      "moves": []}
        self.decision_s: deque[float] = deque(maxlen=4096)  # the latest repack decisions' seconds
        self.decision_cpu_s: deque[float] = deque(maxlen=4096)  # their CPU (wall minus what others ran)

    async def start(self) -> None:
        self._watches = [asyncio.ensure_future(self._watch(name)) for name in self.workers]
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        for task in [self._task, *self._watches]:
            if task is not None:
                task.cancel()

    async def trigger(self) -> None:
        """A weight update happened: repack now (§1.4 trigger 2)."""
        self._trigger.set()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._trigger.wait(), self.repack_interval_s)
            self._trigger.clear()
            await self.check()

    async def _watch(self, name: str) -> None:
        """Wait for one worker's end (its `watch` returns why, or raises: the actor is gone) and
        recover its work at once."""
        try:
            why = await self.workers[name].watch()
        except ActorDied as e:
            why = str(e)
        async with self._lock:
            if name in self.workers:  # (a load poll may have found it first)
                self.failures[name] = why
                await self._recover(name)

    async def check(self, repack: bool = True) -> dict[str, Any]:
        """One round: every worker's load (the heartbeat: the hung and the dead miss it), recovery
        of those, and (if `repack`) Best-Fit."""
        async with self._lock:
            await self._poll_loads()
            if repack:
                await self._repack()
        return await self.get_stats()

    async def _poll_loads(self) -> None:
        # One task a worker under one deadline for all (a wait_for per worker adds a task, a
        # timer and a future each), and only when a repack needs the loads: at 1,024 workers a
        # poll every heartbeat was the controller's largest CPU cost (bench/controller.py).
        names = list(self.workers)
        if not names:
            return
        calls = [asyncio.ensure_future(self.workers[n].load()) for n in names]
        _, late = await asyncio.wait(calls, timeout=self.heartbeat_timeout_s)
        for call in late:
            call.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        answers: list[WorkerLoad | str] = []
        for call in calls:
            if call in late:
                answers.append(f"no heartbeat within {self.heartbeat_timeout_s:g} s")
            elif isinstance(call.exception(), ActorDied):
                answers.append(str(call.exception()))
            else:
                answers.append(call.result())  # (another error is the manager's own: it raises)
        for name, load in zip(names, answers):
            if isinstance(load, str):
                self.failures[name] = load
                await self._recover(name)
            else:
                self.loads[name] = load

    async def _repack(self) -> None:
        t0, cpu0 = time.perf_counter(), time.thread_time()
        self.stats["repack_rounds"] += 1
        plans = [(version, best_fit_repack(loads, self.c_max, self.max_batch))
                 for version, loads in repack_inputs(list(self.loads.values()), self.idle_rule).items()]
        self.decision_s.append(time.perf_counter() - t0)  # the decision alone, before any move
        self.decision_cpu_s.append(time.thread_time() - cpu0)
        for version, plan in plans:
            for src, dst in plan:
                self.stats["repack_plans"] += 1
                await self._move(src, dst, version)
        self.stats["repack_s"] += time.perf_counter() - t0

    async def _move(self, src: str, dst: str, version: int) -> None:
        s, d = self.workers.get(src), self.workers.get(dst)
        if s is None or d is None:
            return
        try:
            moved = await s.export_all(version)
        except ActorDied:
            return  # its watch recovers it
        try:
            ok = bool(moved) and await d.import_trajectories(moved, version)
        except ActorDied:
            ok = False
        if ok:
            await self.partial.move([m.traj_id for m in moved], dst)
            await s.release()
            self.stats["repack_moves"] += len(moved)
            self.stats["moves"].append({"src": src, "dst": dst, "version": version,
                                        "trajectories": [m.traj_id for m in moved]})
        else:
            await s.take_back(moved, version)

    async def _recover(self, name: str) -> None:
        """Restart a dead worker's trajectories elsewhere; training goes on (§1.6)."""
        handle = self.workers.pop(name)
        self.loads.pop(name, None)
        self.dead.append(name)
        if self.on_dead is not None:
            await self.on_dead(handle)
        with contextlib.suppress(Exception):  # a worker whose loop failed still holds an engine
            await asyncio.wait_for(handle.stop(), 10.0)
        by_group: dict[str, list[PartialEntry]] = defaultdict(list)
        for e in await self.partial.of_worker(name):
            by_group[e.group_id].append(e)
        for gid, entries in by_group.items():
            written = set(await self.buffer.pending_members(gid))
            for e in entries:
                if e.traj_id in written:  # reached the buffer just before the worker died
                    await self.partial.close(e.traj_id)
            entries = [e for e in entries if e.traj_id not in written]
            if not entries or await self._restart_same_version(entries):
                continue
            # no live worker holds this version: drop the finished part, regenerate it whole
            await self.buffer.drop_group(gid)
            for e in entries:
                await self.partial.close(e.traj_id)
            await self.prompts.requeue(GroupSpec(gid, entries[0].task, entries[0].group_size))
            self.stats["regenerated_groups"] += 1

    async def _restart_same_version(self, entries: list[PartialEntry]) -> bool:
        version = entries[0].version
        same = sorted((load for load in self.loads.values() if load.version == version),
                      key=lambda load: load.n_reqs)
        for load in same:
            try:
                if await self.workers[load.worker].restart(entries, version):
                    self.stats["restarted"] += len(entries)
                    return True
            except (ActorDied, KeyError):
                continue
        return False

    async def decision_times(self, cpu: bool = False) -> list[float]:
        """Seconds each of the latest repack rounds took to decide its plan (polled loads in,
        moves out), for the run summary (bench/controller.py reports their p50/p99); `cpu`: the
        CPU seconds of each (what a busy machine's other processes cannot add to)."""
        return list(self.decision_cpu_s if cpu else self.decision_s)

    async def get_stats(self) -> dict[str, Any]:
        return dict(self.stats, dead=list(self.dead), failures=dict(self.failures), alive=sorted(self.workers),
                    loads={k: v.__dict__ for k, v in self.loads.items()})
