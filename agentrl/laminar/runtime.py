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
from dataclasses import dataclass, field
from typing import Any, Protocol


class ActorDied(RuntimeError):
    """The component behind a handle is gone (killed, crashed, or its node was lost)."""


class Handle(Protocol):
    """`await handle.method(*args, **kwargs)` runs `method` on the component behind it."""

    name: str

    def __getattr__(self, method: str) -> Callable[..., Any]: ...


_LOCAL: dict[int, LocalHandle] = {}  # handles pickled by reference, as Ray pickles actor handles


def _local_handle(key: int) -> LocalHandle:
    return _LOCAL[key]


def ray_round_trip(value: Any) -> Any:
    """What a Ray actor receives for `value`: a cloudpickle round trip (handles by reference).
    Raises what Ray would raise for an object that cannot cross a process boundary."""
    import cloudpickle

    return cloudpickle.loads(cloudpickle.dumps(value))


class LocalHandle:
    """A component living in this process and event loop. With `serialize`, arguments and
    answers cross it the way they cross a Ray actor boundary (cloudpickle), so a local run
    cannot hide a driver-local object that Ray would refuse or silently copy."""

    def __init__(self, obj: Any, name: str, serialize: bool = False) -> None:
        self._obj = obj
        self.name = name
        self.dead = False
        self.serialize = serialize

    def __reduce__(self) -> tuple[Any, ...]:
        _LOCAL[id(self)] = self
        return (_local_handle, (id(self),))

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("__"):
            raise AttributeError(method)
        fn = getattr(self._obj, method)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise ActorDied(f"{self.name} is dead")
            if self.serialize:
                args, kwargs = ray_round_trip((args, kwargs))
            out = fn(*args, **kwargs)
            if inspect.isawaitable(out):
                out = await out
            if self.dead:  # died while the call ran: the caller must not trust the answer
                raise ActorDied(f"{self.name} died during {method}")
            return ray_round_trip(out) if self.serialize else out

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


@dataclass(frozen=True)
class Resources:
    """What an actor reserves on Ray (ignored locally): CPUs, GPUs, custom resources, and a
    node id to pin it to."""

    num_cpus: float = 0.01
    num_gpus: float = 0.0
    custom: dict[str, float] = field(default_factory=dict)
    node: str | None = None


class Runtime(Protocol):
    kind: str

    def spawn(self, cls: type, *args: Any, name: str, resources: Resources | None = None, **kwargs: Any) -> Any: ...

    async def kill(self, handle: Any) -> None: ...

    async def shutdown(self) -> None: ...


class LocalRuntime:
    """Every component is an object in this process; calls are plain awaits."""

    kind = "local"

    def __init__(self, serialize: bool = False) -> None:
        """`serialize`: constructor arguments and every call cross a cloudpickle round trip,
        as on Ray (objects that hold locks, threads or open sandboxes fail here, not on a cluster)."""
        self.handles: list[LocalHandle] = []
        self.serialize = serialize

    def spawn(self, cls: type, *args: Any, name: str, resources: Resources | None = None,
              **kwargs: Any) -> LocalHandle:
        if self.serialize:
            args, kwargs = ray_round_trip((args, kwargs))
        handle = LocalHandle(cls(*args, **kwargs), name, serialize=self.serialize)
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

        self.started_ray = not ray.is_initialized()  # then `close()` ends the cluster it started
        if self.started_ray:
            if address not in (None, "local"):  # join a running cluster ("auto", "ray://...")
                ray.init(address=address, runtime_env=runtime_env)
            else:  # a cluster of this machine alone, for this process
                ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=runtime_env)
        self.handles: list[RayHandle] = []

    def close(self) -> None:
        """After `shutdown`: end the Ray cluster if this runtime started it (`--ray local`)."""
        import ray

        if self.started_ray and ray.is_initialized():
            ray.shutdown()

    def spawn(self, cls: type, *args: Any, name: str, resources: Resources | None = None,
              **kwargs: Any) -> RayHandle:
        import ray

        res = resources or Resources()
        options: dict[str, Any] = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus, "max_concurrency": 1000,
                                   "max_restarts": 0}
        if res.custom:
            options["resources"] = dict(res.custom)
        if res.node is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(res.node, soft=False)
        actor = ray.remote(cls).options(**options).remote(*args, **kwargs)
        handle = RayHandle(actor, name)
        self.handles.append(handle)
        return handle

    def nodes(self) -> list[str]:
        """The ids of the alive nodes."""
        import ray

        return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]

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
