"""A warm pool of sandboxes with back-pressure, reset on release, health checks and metrics.

    pool = SandboxPool(lambda: make_sandbox(cfg), size=8, name="code")
    await pool.start()                       # starts all 8 now, off the hot path
    async with pool.acquire(timeout=30) as sb:
        await sb.exec("python3 -c 'print(1)'")
    sb = await pool.get(timeout=30)          # for owners that hold one across calls (env reset..close)
    await pool.put(sb)                       # or: await sb.close()
    await pool.close()

Callers get a `Lease`: it forwards the Sandbox protocol, times each exec and counts its faults
(`faults` by kind) for the metrics, and stops working once returned, so a sandbox is never shared
by mistake. Waiters are served strictly first come, first served; a freed sandbox is reset (a
file written by one user is gone for the next) and handed straight to the oldest waiter.

Self-healing: a sandbox known to be dead is never handed out; it is replaced, and a replacement
that fails to start is retried with exponential back-off (`replace_failures` in the metrics, one
log line each). After MAX_FAILED_STARTS failed starts in a row the pool gives up: it is broken,
and every waiter and later `get` gets one SandboxError naming the last failure (an engine that
stopped answering ends a run with that line instead of a hang). A backend with a `liveness` probe
(Docker: the engine's ping) is asked every LIVENESS_S; LIVENESS_MISSES misses in a row break the
pool at once, without waiting for starts that hang; `until_broken()` lets a run stop on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .base import ExecResult, Sandbox
from .common import FAULT_DEAD, FAULT_KINDS, SandboxDead, SandboxError, SandboxTimeout

log = logging.getLogger(__name__)

SandboxFactory = Callable[[], "Sandbox | Awaitable[Sandbox]"]
WINDOW = 10_000  # latency samples kept per metric
RETURN_GRACE_S = 30.0  # how long close() waits for sandboxes being given back to finish their reset
BACKOFF_S = (1.0, 30.0)  # the first and the longest wait before retrying a failed replacement
MAX_FAILED_STARTS = 6  # replacements failing in a row (about a minute of back-off) before the pool gives up
LIVENESS_S, LIVENESS_MISSES = 5.0, 3  # the backend's liveness probe: every 5 s (each may take 2x), 3 misses break it


def percentile(samples: list[float] | deque[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0.0 for no samples."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


class Lease:
    """A pooled sandbox on loan. Implements the Sandbox protocol; `close()` returns it to the pool."""

    def __init__(self, pool: SandboxPool, sandbox: Sandbox) -> None:
        self._pool = pool
        self._sandbox: Sandbox | None = sandbox

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise SandboxError(f"this sandbox was already returned to pool {self._pool.name!r}")
        return self._sandbox

    async def exec(self, cmd: str | list[str], timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | bytes | None = None) -> ExecResult:
        sandbox = self.sandbox
        start = time.perf_counter()
        try:
            result = await sandbox.exec(cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin)
        except SandboxDead:
            self._pool._stats["failures"] += 1
            self._pool._faults[FAULT_DEAD] += 1
            raise
        except Exception:
            self._pool._stats["failures"] += 1
            raise
        self._pool._exec_ms.append((time.perf_counter() - start) * 1000)
        self._pool._stats["execs"] += 1
        self._pool._stats["exec_timeouts"] += int(result.timed_out)
        if result.fault in self._pool._faults:
            self._pool._faults[result.fault] += 1
        return result

    async def write_file(self, path: str, content: str | bytes) -> None:
        await self.sandbox.write_file(path, content)

    async def read_file(self, path: str) -> bytes:
        return await self.sandbox.read_file(path)

    async def upload(self, local_path: str, remote_path: str) -> None:
        await self.sandbox.upload(local_path, remote_path)

    async def download(self, remote_path: str, local_path: str) -> None:
        await self.sandbox.download(remote_path, local_path)

    async def reset(self) -> None:
        await self.sandbox.reset()

    async def close(self) -> None:
        """Give the sandbox back to the pool (idempotent)."""
        if self._sandbox is not None:
            await self._pool.put(self)

    def __repr__(self) -> str:
        return f"Lease({self._sandbox!r}, pool={self._pool.name!r})"


class SandboxPool:
    def __init__(self, factory: SandboxFactory, size: int, name: str = "default",
                 health_interval_s: float | None = 30.0, backoff_s: tuple[float, float] = BACKOFF_S,
                 liveness: Callable[[], None] | None = None) -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"pool size must be an int >= 1, got {size!r}")
        self.factory = factory
        self.size = size
        self.name = name
        self.health_interval_s = health_interval_s
        self.backoff_s = backoff_s  # (first, longest) wait before retrying a failed replacement
        self.liveness = liveness  # a blocking check that the backend answers (raises if not), e.g. Docker's ping
        self._idle: deque[Sandbox] = deque()
        self._leased: dict[int, Sandbox] = {}  # id(Lease) -> sandbox
        self._returning = 0  # sandboxes given back and being reset (neither leased nor idle)
        self._waiters: deque[asyncio.Future[Sandbox]] = deque()
        self._starting = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._health_task: asyncio.Task[None] | None = None
        self._liveness_task: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._wait_ms: deque[float] = deque(maxlen=WINDOW)
        self._startup_ms: deque[float] = deque(maxlen=WINDOW)
        self._exec_ms: deque[float] = deque(maxlen=WINDOW)
        self._stats = {"acquires": 0, "acquire_timeouts": 0, "execs": 0, "exec_timeouts": 0,
                       "failures": 0, "replacements": 0, "replace_failures": 0, "dead_skipped": 0}
        self._faults = dict.fromkeys(FAULT_KINDS, 0)
        self._failed_starts = 0  # replacements that failed in a row
        self.broken: str | None = None  # why the pool gave up (see MAX_FAILED_STARTS, LIVENESS_MISSES)
        self._broken_event = asyncio.Event()

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every sandbox now (concurrently), so acquisition never waits for a start-up."""
        if self._closed:
            raise SandboxError(f"pool {self.name!r} is closed")
        if self._started:
            return
        self._started = True
        self._starting += self.size
        results = await asyncio.gather(*(self._create() for _ in range(self.size)), return_exceptions=True)
        self._starting -= self.size
        errors = [r for r in results if isinstance(r, BaseException)]
        for r in results:
            if not isinstance(r, BaseException):
                self._offer(r)
        if errors:
            await self.close()
            raise SandboxError(f"pool {self.name!r}: {len(errors)} of {self.size} sandboxes failed to start: "
                               f"{errors[0]!r}") from errors[0]
        if self.health_interval_s:
            self._health_task = asyncio.create_task(self._health_loop())
        if self.liveness is not None:
            self._liveness_task = asyncio.create_task(self._liveness_loop())

    async def close(self) -> None:
        """Close every sandbox, idle or on loan; pending waiters get a SandboxError."""
        if self._closed:
            return
        self._closed = True
        for task in (self._health_task, self._liveness_task):
            if task is not None:
                task.cancel()
        for fut in self._waiters:
            if not fut.done():
                fut.set_exception(SandboxError(f"pool {self.name!r} was closed while waiting"))
        self._waiters.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        doomed = list(self._idle) + list(self._leased.values())
        self._idle.clear()
        self._leased.clear()
        await asyncio.gather(*(self._close_quietly(sb) for sb in doomed))
        # A sandbox given back during close is mid-reset: its `put` closes it when the reset ends.
        # Wait for that, so a caller that ends the process next (a Ray pool actor is killed right
        # after close) does not leave it running.
        deadline = time.monotonic() + RETURN_GRACE_S
        while self._returning and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- acquisition ------------------------------------------------------------------------------

    async def get(self, timeout: float | None = None) -> Lease:
        """Borrow a sandbox; waits (FIFO) while all are busy. Raises SandboxTimeout after `timeout` s."""
        if self._closed:
            raise SandboxError(f"pool {self.name!r} is closed")
        if self.broken:
            raise SandboxError(self.broken)
        if not self._started:
            await self.start()
        start = time.perf_counter()
        sandbox = None
        while self._idle and not self._waiters and sandbox is None:
            sandbox = self._checked(self._idle.popleft())
        if sandbox is None:
            sandbox = await self._wait(timeout)
        self._wait_ms.append((time.perf_counter() - start) * 1000)
        self._stats["acquires"] += 1
        lease = Lease(self, sandbox)
        self._leased[id(lease)] = sandbox
        return lease

    async def _wait(self, timeout: float | None) -> Sandbox:
        fut: asyncio.Future[Sandbox] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            done, _ = await asyncio.wait({fut}, timeout=timeout)
        except asyncio.CancelledError:
            self._abandon(fut)
            raise
        if not done:
            self._abandon(fut)
            self._stats["acquire_timeouts"] += 1
            raise SandboxTimeout(f"no sandbox free in pool {self.name!r} within {timeout} s "
                                 f"(size {self.size}, {len(self._leased)} on loan, {len(self._waiters)} waiting)")
        return fut.result()

    def _abandon(self, fut: asyncio.Future[Sandbox]) -> None:
        """A waiter gave up; if a sandbox reached it meanwhile, pass that on."""
        with contextlib.suppress(ValueError):
            self._waiters.remove(fut)
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            self._offer(fut.result())
        else:
            fut.cancel()

    async def put(self, lease: Lease) -> None:
        """Return a borrowed sandbox: it is reset, then handed to the next waiter (or kept idle).
        A sandbox whose reset fails is replaced by a fresh one."""
        if self._closed:  # close() already closed everything on loan
            lease._sandbox = None
            return
        sandbox = self._leased.pop(id(lease), None)
        if sandbox is None or lease._sandbox is None:
            raise SandboxError(f"{lease!r} is not on loan from pool {self.name!r}")
        lease._sandbox = None
        self._returning += 1
        try:
            try:
                await sandbox.reset()  # a reset that works is health check enough (a dead container fails it)
                healthy = True
            except Exception as e:
                log.warning("pool %s: reset of %r failed (%r); replacing it", self.name, sandbox, e)
                self._stats["failures"] += 1
                healthy = False
            if self._closed:  # the pool closed during the reset: nobody will take this one again
                await self._close_quietly(sandbox)
                return
        finally:
            self._returning -= 1
        if healthy:
            self._offer(sandbox)
        else:
            await self._replace(sandbox)

    @contextlib.asynccontextmanager
    async def acquire(self, timeout: float | None = None) -> AsyncIterator[Lease]:
        lease = await self.get(timeout=timeout)
        try:
            yield lease
        finally:
            if lease._sandbox is not None:
                await asyncio.shield(self.put(lease))

    # -- internals --------------------------------------------------------------------------------

    def _checked(self, sandbox: Sandbox) -> Sandbox | None:
        """`sandbox` when it is not known to be dead; else None, and a replacement is on its way."""
        if getattr(sandbox, "alive", True):
            return sandbox
        log.warning("pool %s: %r died while idle; replacing it", self.name, sandbox)
        self._stats["dead_skipped"] += 1
        self._spawn(self._replace(sandbox))
        return None

    def _offer(self, sandbox: Sandbox) -> None:
        """Hand a ready sandbox to the oldest live waiter, or park it."""
        if self._closed:
            self._spawn(self._close_quietly(sandbox))
            return
        if self._checked(sandbox) is None:
            return
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(sandbox)
                return
        self._idle.append(sandbox)

    async def _create(self) -> Sandbox:
        start = time.perf_counter()
        made = self.factory()
        sandbox: Sandbox = await made if inspect.isawaitable(made) else made  # type: ignore[assignment]
        try:
            if hasattr(sandbox, "start"):
                await sandbox.start()
        except BaseException:
            await self._close_quietly(sandbox)
            raise
        self._startup_ms.append((time.perf_counter() - start) * 1000)
        return sandbox

    async def _replace(self, sandbox: Sandbox) -> None:
        self._stats["replacements"] += 1
        await self._close_quietly(sandbox)
        await self._start_replacement()

    async def _start_replacement(self) -> None:
        """Start one sandbox for the pool; on failure retry with back-off, or give up (`broken`)."""
        if self._closed or self.broken:
            return
        self._starting += 1
        try:
            fresh = await self._create()
        except Exception as e:
            self._stats["failures"] += 1
            self._stats["replace_failures"] += 1
            self._failed_starts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                self._give_up(f"pool {self.name!r}: {self._failed_starts} sandbox starts in a row failed, the "
                              f"last with {e!r}; is the sandbox backend (e.g. the Docker engine) up?")
                return
            delay = min(self.backoff_s[0] * 2 ** (self._failed_starts - 1), self.backoff_s[1])
            log.error("pool %s: could not start a replacement sandbox (%d in a row): %r; retrying in %g s",
                      self.name, self._failed_starts, e, delay)
            self._spawn(self._retry_after(delay))
            return
        finally:
            self._starting -= 1
        self._failed_starts = 0
        self._offer(fresh)

    async def _retry_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._start_replacement()

    async def until_broken(self) -> str:
        """Wait until the pool gives up; returns why."""
        await self._broken_event.wait()
        return self.broken or ""

    def _give_up(self, why: str) -> None:
        """Too many failed starts, or a backend that stopped answering: fail every waiter now and
        every later get, with `why`."""
        if self.broken:
            return
        log.error("%s", why)
        self.broken = why
        self._broken_event.set()
        for fut in self._waiters:
            if not fut.done():
                fut.set_exception(SandboxError(why))
        self._waiters.clear()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _healthy(sandbox: Sandbox) -> bool:
        check = getattr(sandbox, "healthy", None)
        return True if check is None else bool(await check())

    async def _close_quietly(self, sandbox: Sandbox) -> None:
        try:
            await sandbox.close()
        except Exception as e:
            log.warning("pool %s: closing %r failed: %r", self.name, sandbox, e)

    async def check_health(self) -> int:
        """Check every idle sandbox now; replace the dead ones. Returns how many were replaced."""
        idle = list(self._idle)
        self._idle.clear()
        checks = await asyncio.gather(*(self._healthy(sb) for sb in idle), return_exceptions=True)
        dead = []
        for sandbox, ok in zip(idle, checks):
            if ok is True:
                self._offer(sandbox)
            else:
                dead.append(sandbox)
        await asyncio.gather(*(self._replace(sb) for sb in dead))
        return len(dead)

    async def _health_loop(self) -> None:
        assert self.health_interval_s
        while not self._closed:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.check_health()
            except Exception as e:  # never let the sweeper die
                log.warning("pool %s: health sweep failed: %r", self.name, e)

    async def _liveness_loop(self) -> None:
        """Ask the backend whether it answers, from a thread of its own (the shared worker threads
        may all hang on a dead engine); LIVENESS_MISSES misses in a row break the pool."""
        assert self.liveness is not None
        probe = ThreadPoolExecutor(1, thread_name_prefix=f"pool-{self.name}-liveness")
        loop = asyncio.get_running_loop()
        misses = 0
        try:
            while not self.broken:
                await asyncio.sleep(LIVENESS_S)
                try:
                    await asyncio.wait_for(loop.run_in_executor(probe, self.liveness), 2 * LIVENESS_S)
                    misses = 0
                except Exception as e:
                    misses += 1
                    last = f"no answer within {2 * LIVENESS_S:g} s" if isinstance(e, TimeoutError) else repr(e)
                    log.warning("pool %s: the sandbox backend did not answer (%d in a row): %s", self.name, misses, last)
                    if misses >= LIVENESS_MISSES:
                        self._give_up(f"pool {self.name!r}: the sandbox backend stopped answering ({misses} "
                                      f"checks in a row failed, the last: {last})")
        finally:
            probe.shutdown(wait=False)

    # -- metrics ----------------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "idle": len(self._idle),
            "in_use": len(self._leased),
            "starting": self._starting,
            "waiting": sum(1 for f in self._waiters if not f.done()),
            **self._stats,
            "faults": dict(self._faults),
            "broken": self.broken or "",
            "acquire_wait_p50_ms": percentile(self._wait_ms, 50),
            "acquire_wait_p99_ms": percentile(self._wait_ms, 99),
            "startup_p50_ms": percentile(self._startup_ms, 50),
            "startup_p99_ms": percentile(self._startup_ms, 99),
            "exec_p50_ms": percentile(self._exec_ms, 50),
            "exec_p99_ms": percentile(self._exec_ms, 99),
        }
