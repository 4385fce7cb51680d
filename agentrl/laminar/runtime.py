"""One code path, two runtimes (design §9): local asyncio objects or Ray actors.

Laminar's components (relays, buffer, prompt pool, partial-response pool, workers, manager)
talk to each other only through *handles*: `await handle.method(*args)`. A `LocalHandle` calls
the object in this process; a `RayHandle` calls `actor.method.remote(...)`. The classes are the
same in both cases, and a dead peer raises `ActorDied` in both (local: `runtime.kill(handle)`,
the object's tasks are cancelled; Ray: `ray.kill`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable
from typing import Any, Protocol


class ActorDied(RuntimeError):
    """The component behind a handle is gone (killed, crashed, or its node was lost)."""


class Handle(Protocol):
    """`await handle.method(*args, **kwargs)` runs `method` on the component behind it."""

    name: str

    def __getattr__(self, method: str) -> Callable[..., Any]: ...


class LocalHandle:
    """A component living in this process and event loop."""

    def __init__(self, obj: Any, name: str) -> None:
        self._obj = obj
        self.name = name
        self.dead = False

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("__"):
            raise AttributeError(method)
        fn = getattr(self._obj, method)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise ActorDied(f"{self.name} is dead")
            out = fn(*args, **kwargs)
            if inspect.isawaitable(out):
                out = await out
            if self.dead:  # died while the call ran: the caller must not trust the answer
                raise ActorDied(f"{self.name} died during {method}")
            return out

        return call

    @property
    def obj(self) -> Any:
        """The object itself (tests and the local runtime only)."""
        return self._obj

    def __repr__(self) -> str:
        return f"LocalHandle({self.name})"


class RayHandle:
    """A Ray actor; picklable, so it can be passed to other actors."""

    def __init__(self, actor: Any, name: str) -> None:
        self._actor = actor
        self.name = name

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        remote = getattr(self._actor, method).remote

        async def call(*args: Any, **kwargs: Any) -> Any:
            import ray.exceptions

            try:
                return await remote(*args, **kwargs)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as e:
                raise ActorDied(f"{self.name}: {e}") from e

        return call

    @property
    def actor(self) -> Any:
        return self._actor

    def __repr__(self) -> str:
        return f"RayHandle({self.name})"


class Runtime(Protocol):
    kind: str

    def spawn(self, cls: type, *args: Any, name: str, **kwargs: Any) -> Any: ...

    async def kill(self, handle: Any) -> None: ...

    async def shutdown(self) -> None: ...


class LocalRuntime:
    """Every component is an object in this process; calls are plain awaits."""

    kind = "local"

    def __init__(self) -> None:
        self.handles: list[LocalHandle] = []

    def spawn(self, cls: type, *args: Any, name: str, **kwargs: Any) -> LocalHandle:
        handle = LocalHandle(cls(*args, **kwargs), name)
        self.handles.append(handle)
        return handle

    async def kill(self, handle: LocalHandle) -> None:
        """Fault injection: the component stops at once and its peers see `ActorDied`."""
        handle.dead = True
        stop = getattr(handle.obj, "stop", None)
        if stop is not None:
            await stop()

    async def shutdown(self) -> None:
        for h in self.handles:
            if not h.dead:
                stop = getattr(h.obj, "stop", None)
                if stop is not None:
                    await stop()


class RayRuntime:
    """Every component is a Ray actor (async actor: its methods run on the actor's own loop)."""

    kind = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = 2,
                 runtime_env: dict[str, Any] | None = None) -> None:
        import ray

        if not ray.is_initialized():
            if address is not None:
                ray.init(address=address, runtime_env=runtime_env)
            else:
                ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=runtime_env)
        self.handles: list[RayHandle] = []

    def spawn(self, cls: type, *args: Any, name: str, num_cpus: float = 0.01,
              **kwargs: Any) -> RayHandle:
        import ray

        actor = ray.remote(cls).options(num_cpus=num_cpus, max_concurrency=1000,
                                        max_restarts=0).remote(*args, **kwargs)
        handle = RayHandle(actor, name)
        self.handles.append(handle)
        return handle

    async def kill(self, handle: RayHandle) -> None:
        import ray

        ray.kill(handle.actor, no_restart=True)

    async def shutdown(self) -> None:
        import ray

        for h in self.handles:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(h.actor, no_restart=True)
        self.handles.clear()


def make_runtime(kind: str = "local", address: str | None = None, num_cpus: int | None = 2) -> Runtime:
    if kind == "local":
        return LocalRuntime()
    if kind == "ray":
        return RayRuntime(address=address, num_cpus=num_cpus)
    raise ValueError(f"unknown runtime {kind!r}; expected 'local' or 'ray'")


async def gather_alive(calls: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Await named calls concurrently; return the answers and the names whose actor died."""
    names = list(calls)
    outs = await asyncio.gather(*calls.values(), return_exceptions=True)
    ok: dict[str, Any] = {}
    dead: list[str] = []
    for n, o in zip(names, outs):
        if isinstance(o, ActorDied):
            dead.append(n)
        elif isinstance(o, BaseException):
            raise o
        else:
            ok[n] = o
    return ok, dead
