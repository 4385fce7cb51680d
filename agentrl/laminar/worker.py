"""Rollout worker: one inference engine, many trajectories, one weight version at a time.

Laminar (arXiv 2510.12633) §3.1–3.2, §5; algorithms.md §1.2, §1.4. A worker takes a batch of
prompt groups (all G samples of a prompt stay together), generates them, and only when it holds
no trajectory pulls the newest weights from its relay — so every token of a trajectory comes
from one version. It streams each trajectory's progress to the partial-response pool, reports
its load (tokens in flight as the KV-use proxy on CPU, trajectory count, version) and can hand
its trajectories to another worker of the same version when the manager repacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentrl.inference.base import InferenceEngine, SamplingParams
from agentrl.laminar.runtime import ActorDied, current_node
from agentrl.laminar.types import FetchPolicy, GroupSpec, Moved, PartialEntry, WorkerLoad
from agentrl.rollout.engine import RolloutEngine, RolloutState
from agentrl.types import Task, Trajectory

__all__ = ["EngineRunner", "Moved", "RolloutWorker", "WorkerFailed", "WorkerLoad"]


class WorkerFailed(ActorDied):
    """A worker's own loop raised: it is as good as dead (the manager recovers its work)."""


class EngineRunner:
    """Adapts `agentrl.rollout.RolloutEngine` to the worker: start/resume trajectories as tasks,
    queue the finished ones, export at a turn boundary."""

    def __init__(self, rollout: RolloutEngine, env_factory: Callable[[], Any]) -> None:
        self.rollout = rollout
        self.env_factory = env_factory
        self._done: asyncio.Queue[Trajectory] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, call: Callable[[], Awaitable[Trajectory | None]]) -> None:
        async def run() -> None:
            traj = await call()
            if traj is not None:  # None: exported, it finishes elsewhere
                self._done.put_nowait(traj)

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def start(self, traj_id: str, group_id: str, task: Task) -> None:
        self._spawn(lambda: self.rollout.run_trajectory(self.env_factory(), task, traj_id=traj_id,
                                                        group_id=group_id))

    def resume(self, state: RolloutState) -> None:
        self._spawn(lambda: self.rollout.resume(state, self.env_factory))

    async def export(self, traj_id: str, portable: bool) -> RolloutState | None:
        """Pause at the next turn boundary. `portable` (another process): drop the live env,
        the destination rebuilds it by replaying the actions."""
        state = await self.rollout.export(traj_id)
        if state is not None and portable and state.env is not None:
            env, state.env = state.env, None
            close = getattr(env, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
        return state

    async def next_finished(self) -> Trajectory:
        return await self._done.get()

    async def close(self) -> None:
        await self.rollout.aclose()
        for t in list(self._tasks):
            t.cancel()


class RolloutWorker:
    def __init__(self, worker_id: str, engine: InferenceEngine | Callable[[], InferenceEngine],
                 env_factory: Callable[[], Any], *, relay: Any, prompts: Any, buffer: Any, partial: Any,
                 sampling: SamplingParams | None = None, rollout_kwargs: dict[str, Any] | None = None,
                 groups_per_batch: int = 2, kv_capacity_tokens: int = 16384,
                 fetch_policy: FetchPolicy = "wait_inflight", portable_state: bool = False,
                 idle_poll_s: float = 0.05, top_up_trajectories: int = 0) -> None:
        """`engine` is an InferenceEngine, or a zero-argument factory (a Ray actor builds its
        own). `rollout_kwargs` go to RolloutEngine (concurrency, max_context_tokens, ...).
        `top_up_trajectories` > 0: while busy, also take released groups at the version held, up to
        that many trajectories in flight (`global-async`, whose trainer releases the next batch on
        the same weights while this one runs: one decode batch of both costs little more than
        one); 0 (Laminar): take work only when empty, right after pulling the newest weights."""
        if groups_per_batch < 1:
            raise ValueError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
        if kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {kv_capacity_tokens}")
        if top_up_trajectories < 0:
            raise ValueError(f"top_up_trajectories must be >= 0 (0: off), got {top_up_trajectories}")
        self.id = worker_id
        self._engine_or_factory = engine
        self.env_factory = env_factory
        self.sampling = sampling or SamplingParams()
        self.rollout_kwargs = dict(rollout_kwargs or {})
        self.portable_state = portable_state
        self.relay, self.prompts, self.buffer, self.partial = relay, prompts, buffer, partial
        self.groups_per_batch = groups_per_batch
        self.kv_capacity_tokens = kv_capacity_tokens
        self.fetch_policy = fetch_policy
        self.idle_poll_s = idle_poll_s
        self.top_up_trajectories = top_up_trajectories
        self.engine: InferenceEngine | None = None
        self.runner: EngineRunner | None = None
        self._inflight: dict[str, GroupSpec] = {}  # traj id -> its group
        self._tokens: dict[str, int] = {}
        self._peak = 0.0
        self._c_last = 0.0
        self.failure: str | None = None  # why a loop of this worker died
        self._held = False  # exported for a repack, waiting for the manager's verdict
        self._pulling = False
        self._wake = asyncio.Event()
        self._ended = asyncio.Event()  # failed or stopped: what `watch` waits for
        self._tasks: list[asyncio.Task[None]] = []
        self._bg: set[asyncio.Future[Any]] = set()
        self.stats: dict[str, Any] = {"finished": 0, "written": 0, "groups_taken": 0, "moved_out": 0,
                                      "moved_in": 0, "restarted": 0, "idle_s": 0.0, "pulls": [],
                                      "versions": [], "errors": []}

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> str:
        """Build the engine (in this process: a Ray actor builds its own) and start the loops."""
        eng = self._engine_or_factory
        self.engine = eng if hasattr(eng, "generate") else eng()  # type: ignore[operator]
        tokenizer = self.rollout_kwargs.pop("tokenizer", None) or self.engine.tokenizer  # type: ignore[attr-defined]
        rollout = RolloutEngine(self.engine, tokenizer, self.sampling, on_progress=self._on_progress,
                                **self.rollout_kwargs)
        self.runner = EngineRunner(rollout, self.env_factory)
        self._tasks = [asyncio.ensure_future(self._supervised(self._drive)),
                       asyncio.ensure_future(self._supervised(self._collect))]
        return self.id

    async def _supervised(self, loop: Callable[[], Awaitable[None]]) -> None:
        """A loop that raises kills the worker: its `watch` returns, and every call of the manager's
        fails from then on, so its trajectories regenerate elsewhere (a silent dead loop would hang the run)."""
        try:
            await loop()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # any failure ends the worker
            self.failure = f"{loop.__name__}: {type(e).__name__}: {e}"
            self.stats["errors"].append(self.failure)
            self._ended.set()
            for t in self._tasks:
                if t is not asyncio.current_task():
                    t.cancel()

    async def node(self) -> str:
        """The Ray node this worker runs on ("local" outside Ray)."""
        return current_node()

    async def pid(self) -> int:
        """The OS process this worker runs in (on Ray: its actor's worker process; chaos tests kill it)."""
        return os.getpid()

    async def set_relay(self, relay: Any) -> None:
        """Before `start`: fetch weights from this relay (the one on this worker's node)."""
        self.relay = relay

    async def stop(self) -> None:
        self._ended.set()
        for t in self._tasks:
            t.cancel()
        if self.runner is not None:
            await self.runner.close()
        if self.engine is not None:
            await self.engine.close()

    @property
    def version(self) -> int:
        return self.engine.version if self.engine is not None else -1

    # -- the two loops -------------------------------------------------------------------------

    async def _drive(self) -> None:
        """Empty → pull weights → take a batch → wait until empty again (topping up meanwhile,
        at the version held, where `top_up_trajectories` allows)."""
        while True:
            room = self._top_up_room()
            if self._held or (self._inflight and room == 0):
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._inflight:  # busy, with room: no pull (every token of a trajectory has one version)
                specs = await self.prompts.take(room, self.version)
                if specs:
                    await self._start_groups(specs)
                else:  # a release wakes this at once; a trajectory leaving, within a poll
                    await self.prompts.wait_change(self.idle_poll_s)
                continue
            t0 = time.perf_counter()
            await self._pull()
            specs = await self.prompts.take(self.groups_per_batch, self.version)
            if not specs:
                await self.prompts.wait_change(self.idle_poll_s)
                self.stats["idle_s"] += time.perf_counter() - t0
                continue
            self.stats["idle_s"] += time.perf_counter() - t0
            self._peak = 0.0
            await self._start_groups(specs)

    async def _start_groups(self, specs: list[GroupSpec]) -> None:
        """Generate every trajectory of the groups taken, at the version held."""
        self.stats["groups_taken"] += len(specs)
        await self._launch([(tid, s) for s in specs for tid in s.traj_ids], self.version)

    def _top_up_room(self) -> int:
        """Whole groups that fit beside the trajectories in flight under `top_up_trajectories`."""
        if not self._inflight or self.top_up_trajectories == 0:
            return 0
        group_size = next(iter(self._inflight.values())).size
        return max(0, self.top_up_trajectories - len(self._inflight)) // group_size

    async def _collect(self) -> None:
        assert self.runner is not None
        while True:
            traj = await self.runner.next_finished()
            spec = self._inflight.pop(traj.id, None)
            self._tokens.pop(traj.id, None)
            if spec is None:  # exported meanwhile; its new owner reports it
                continue
            self.stats["finished"] += 1
            try:
                v = traj.version
                if v is not None and v != self.version:
                    raise ValueError(f"trajectory {traj.id} has version {v}, worker holds {self.version}")
                await self.buffer.write(traj)
                self.stats["written"] += 1
            except ValueError as e:  # never kill the worker for one bad trajectory
                self.stats["errors"].append(str(e))
            await self.partial.close(traj.id)
            if not self._inflight or self.top_up_trajectories:  # empty, or maybe room to top up
                self._wake.set()

    async def _pull(self) -> None:
        """Fetch newer weights from the colocated relay, only ever with no trajectory held."""
        assert self.engine is not None
        self._pulling = True
        try:
            t0 = time.perf_counter()
            snap = await self.relay.fetch_latest(self.version, self.fetch_policy)
            if snap is not None:
                await snap.resolve()  # on Ray: map the node's one copy in the object store
                await self.engine.load_weights(snap.state_dict(), snap.version)
                self.stats["pulls"].append((snap.version, time.perf_counter() - t0))
                self.stats["versions"].append(snap.version)
        finally:
            self._pulling = False

    async def _launch(self, items: list[tuple[str, GroupSpec]], version: int,
                      states: dict[str, Any] | None = None) -> None:
        assert self.runner is not None
        await self.partial.open([PartialEntry(tid, s.group_id, s.size, s.task, self.id, version)
                                 for tid, s in items])
        for tid, spec in items:
            self._inflight[tid] = spec
            self._tokens[tid] = 0
            if states is not None and tid in states:
                self.runner.resume(states[tid])
            else:
                self.runner.start(tid, spec.group_id, spec.task)

    def _on_progress(self, traj_id: str, tokens: int) -> None:
        if traj_id in self._tokens:
            self._tokens[traj_id] = tokens
            # the plateau is tracked here too: heartbeats alone can miss a short-lived peak
            self._peak = max(self._peak, sum(self._tokens.values()) / self.kv_capacity_tokens)
            task = asyncio.ensure_future(self.partial.progress(traj_id, tokens))
            self._bg.add(task)  # fire and forget, but keep a reference until it is done
            task.add_done_callback(self._bg.discard)

    # -- what the manager calls ----------------------------------------------------------------

    async def watch(self) -> str:
        """Returns, with why, when this worker fails or stops. The manager keeps one such call open
        per worker: a death reaches it as it happens (a killed Ray actor's open call raises at
        once), with no call per worker per tick."""
        await self._ended.wait()
        return f"{self.id} failed: {self.failure}" if self.failure is not None else f"{self.id} stopped"

    async def load(self) -> WorkerLoad:
        """The heartbeat, polled at each repack: a dead or hung worker fails to answer."""
        if self.failure is not None:
            raise WorkerFailed(f"{self.id} failed: {self.failure}")
        tokens = sum(self._tokens.values())
        c = tokens / self.kv_capacity_tokens
        self._peak = max(self._peak, c)
        prev, self._c_last = self._c_last, c
        return WorkerLoad(self.id, self.version, len(self._inflight), tokens, c, self._peak,
                          self._pulling, self._held, time.monotonic(), prev)

    async def export_all(self, version: int) -> list[Moved]:
        """Stop every trajectory and return them for a destination; the worker then holds
        still (no pull) until `release` or `take_back`. Refuses (returns []) if it moved on."""
        runner = self.runner
        assert runner is not None
        if self._pulling or self.version != version or self._held or self.failure is not None:
            return []
        self._held = True  # from now on: no pull, even once the last trajectory has left

        async def one(tid: str) -> RolloutState | None:
            try:
                return await runner.export(tid, self.portable_state)
            except KeyError:  # finished a moment ago
                return None

        items = list(self._inflight.items())
        states = await asyncio.gather(*(one(tid) for tid, _ in items))
        out = []
        for (tid, spec), state in zip(items, states):
            if state is None:  # it finished first and went to the buffer
                continue
            self._inflight.pop(tid, None)
            self._tokens.pop(tid, None)
            out.append(Moved(tid, spec.group_id, spec.size, spec.task, state))
        self.stats["moved_out"] += len(out)
        return out

    async def import_trajectories(self, moved: list[Moved], version: int) -> bool:
        """Resume trajectories exported by a worker of the same version; False if this one
        holds another version or is pulling (the manager then gives them back)."""
        if self._pulling or self.version != version or self._held or self.failure is not None:
            return False
        specs = {m.group_id: GroupSpec(m.group_id, m.task, m.group_size) for m in moved}
        await self._launch([(m.traj_id, specs[m.group_id]) for m in moved], version,
                           states={m.traj_id: m.state for m in moved})
        self._peak = max(self._peak, (await self.load()).c_used)
        self.stats["moved_in"] += len(moved)
        return True

    async def take_back(self, moved: list[Moved], version: int) -> None:
        """Undo an export whose destination refused."""
        self._held = False
        self.stats["moved_out"] -= len(moved)
        if moved:
            await self._launch([(m.traj_id, GroupSpec(m.group_id, m.task, m.group_size)) for m in moved],
                               version, states={m.traj_id: m.state for m in moved})
        self._wake.set()

    async def release(self) -> None:
        """The repack is done: this worker is free to pull new weights and start fresh."""
        self._held = False
        self._wake.set()

    async def restart(self, entries: list[PartialEntry], version: int) -> bool:
        """Regenerate from scratch the trajectories of a dead worker (same ids, same version)."""
        if self._pulling or self.version != version or self._held or self.failure is not None:
            return False
        await self._launch([(e.traj_id, GroupSpec(e.group_id, e.task, e.group_size)) for e in entries], version)
        self.stats["restarted"] += len(entries)
        return True

    async def get_stats(self) -> dict[str, Any]:
        return dict(self.stats, id=self.id, version=self.version, in_flight=len(self._inflight),
                    node=current_node(), pid=os.getpid(), relay=getattr(self.relay, "name", None))
