"""One code path, two runtimes (architecture.md §9): local asyncio objects or Ray actors.

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
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrl.config import Config


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
    import cloudpickle  # optional: the ray extra

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
            import ray  # optional: the ray extra
            import ray.exceptions  # optional: the ray extra

            if not ray.is_initialized():  # a call after shutdown would start a fresh cluster (auto-init)
                raise ActorDied(f"{self.name}: Ray is shut down")
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
class InStore:
    """A value in the object store of the sender's node, passed by reference (Ray hands a reference
    nested in an argument over as it is): the actor it is sent to maps that one copy, and may keep
    it and hand it on, instead of receiving a copy of its own."""

    ref: Any


def put_for(handle: Any, value: Any) -> Any:
    """`value` as it should travel to `handle`: for a Ray actor, put into this node's object store
    once (`InStore`; large numpy arrays in it are written out of band, one memcpy); for a local
    component, as it is."""
    if not isinstance(handle, RayHandle):
        return value
    import ray  # optional: the ray extra

    return InStore(ray.put(value))


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


def current_node() -> str:
    """This process's Ray node id, or "local" outside Ray (or without it installed)."""
    try:
        import ray  # optional dependency (the `ray` extra)

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except ImportError:
        pass
    return "local"


def this_node_first(nodes: list[str]) -> list[str]:
    """`nodes` with this process's node first: the trainer's node hosts the master relay, which
    serves the trainer's own object-store copy of a push (`put_for`) to that node's workers, so
    the push crosses no network before the chain starts and that node keeps one copy."""
    here = current_node()
    return sorted(nodes, key=lambda node: node != here)


def local_cluster_cpus(cfg: Config) -> int:
    """Logical CPUs of a `--ray local` cluster: enough for every actor this run reserves
    (Ray would otherwise leave an actor pending forever on a small machine)."""
    lam, tr = cfg.laminar, cfg.trainer
    learners = tr.num_learners * tr.learner_num_cpus if tr.num_learners > 1 else 0  # Ray-placed ranks
    needed = lam.num_workers * lam.worker_num_cpus + lam.pool_num_cpus + learners + 1
    return max(os.cpu_count() or 1, int(needed + 0.999))


def ray_runtime(cfg: Config) -> RayRuntime:
    """The Ray runtime `laminar.ray_address` names (an existing one if Ray is already up)."""
    address = cfg.laminar.ray_address
    return RayRuntime(address=address, num_cpus=local_cluster_cpus(cfg) if address == "local" else None)


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
        import ray  # optional: the ray extra

        self.started_ray = not ray.is_initialized()  # then `close()` ends the cluster it started
        self.reaper: Reaper | None = None
        if self.started_ray:
            if address not in (None, "local"):  # join a running cluster ("auto", "ray://...")
                ray.init(address=address, runtime_env=runtime_env)
            else:  # a cluster of this machine alone, for this process: it must not outlive it
                self.reaper = Reaper() if os.path.isdir("/proc") else None  # Linux (bubblewrap's home)
                with self.reaper.marking() if self.reaper is not None else contextlib.nullcontext():
                    ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=runtime_env)
        self.handles: list[RayHandle] = []

    def close(self) -> None:
        """After `shutdown`: end the Ray cluster if this runtime started it (`--ray local`)."""
        import ray  # optional: the ray extra

        if self.started_ray and ray.is_initialized():
            ray.shutdown()
        if self.reaper is not None:  # sweeps what `ray.shutdown` left behind, then exits
            self.reaper.close()
            self.reaper = None

    def spawn(self, cls: type, *args: Any, name: str, resources: Resources | None = None,
              **kwargs: Any) -> RayHandle:
        import ray  # optional: the ray extra

        res = resources or Resources()
        options: dict[str, Any] = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus, "max_concurrency": 1000,
                                   "max_restarts": 0}
        if res.custom:
            options["resources"] = dict(res.custom)
        if res.node is not None:
            # optional: the ray extra
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(res.node, soft=False)
        actor = ray.remote(cls).options(**options).remote(*args, **kwargs)
        handle = RayHandle(actor, name)
        self.handles.append(handle)
        return handle

    def nodes(self) -> list[str]:
        """The ids of the alive nodes."""
        import ray  # optional: the ray extra

        return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]

    async def kill(self, handle: RayHandle) -> None:
        import ray  # optional: the ray extra

        ray.kill(handle.actor, no_restart=True)

    async def shutdown(self) -> None:
        import ray  # optional: the ray extra

        for h in self.handles:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(h.actor, no_restart=True)
        self.handles.clear()


REAP_ENV = "AGENTRL_RAY_REAP"


class Reaper:
    """Ends every process of a `--ray local` cluster once the driver that started it is gone, also
    when the driver is SIGKILLed. Ray shares the fate of its GCS and raylet with the driver
    (PR_SET_PDEATHSIG) and workers exit with their raylet, but its dashboard and runtime-env agents
    hang on for a minute or more trying to report to the dead GCS.

    The reaper is a small process of its own session holding the read end of a pipe from the
    driver. It is told the processes `ray.init` started (the driver's new children) and follows
    their process tree (pid and start time, re-read every 0.5 s: what Ray starts later, agents and
    actor workers, descends from the raylet); processes that still show `AGENTRL_RAY_REAP=<token>`
    in their environment count too (Ray's `setproctitle` overwrites that area in many of them, so
    the tree is what holds). When the pipe closes or the driver's pid is gone it SIGKILLs them all
    (sandboxes started by those processes go with them: bwrap runs with `--die-with-parent`).
    After a crash it also removes leftover local sandbox dirs, and the Docker sandboxes of runs
    named with `watch_run(..., docker=True)`.
    """

    def __init__(self) -> None:
        self.token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        env = {k: v for k, v in os.environ.items() if k != REAP_ENV}
        # -I: stdlib only, nothing from the script's folder; DEVNULL: never hold a caller's pipes open
        self.proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "--reap", str(os.getpid()),
                                      self.token], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env, start_new_session=True, cwd=os.getcwd())
        _REAPERS.append(self)  # the pipe must not close with a dropped runtime object while Ray runs

    @contextlib.contextmanager
    def marking(self) -> Iterator[None]:
        """Processes started inside the block (Ray's, and what they start) belong to the cluster:
        they carry the token, and the reaper follows their process tree."""
        old = os.environ.get(REAP_ENV)
        before = set(_children(os.getpid()))
        os.environ[REAP_ENV] = self.token
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(REAP_ENV, None)
            else:
                os.environ[REAP_ENV] = old
            roots = sorted(set(_children(os.getpid())) - before)
            if roots:
                self._send("roots " + " ".join(map(str, roots)))

    def watch_run(self, run_id: str, docker: bool = False) -> None:
        """After a crash, also prune the sandboxes of `run_id` (Docker containers when `docker`)."""
        self._send(f"run {run_id} {int(docker)}")

    def _send(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()

    def close(self, timeout_s: float = 15.0) -> None:
        """A clean end: the reaper kills what is left of the cluster (nothing, normally) and exits."""
        self._send("bye")
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self in _REAPERS:
            _REAPERS.remove(self)


_REAPERS: list[Reaper] = []


def proc_stat(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name (state first, parent pid second,
    start time at index 19); None when the process is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else fields


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (None: gone or a zombie), so a reused pid is not mistaken."""
    fields = proc_stat(pid)
    return None if fields is None else fields[19].decode()


def _table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every live, non-zombie process."""
    out = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        fields = proc_stat(name)
        if fields is not None:
            out[int(name)] = (int(fields[1]), fields[19].decode())
    return out


def _children(pid: int) -> list[int]:
    return [p for p, (ppid, _) in _table().items() if ppid == pid]


def _follow(tracked: dict[int, str]) -> None:
    """Update `tracked` (pid -> start time): drop the processes that are gone, add descendants."""
    table = _table()
    for pid, born in list(tracked.items()):
        if pid not in table or table[pid][1] != born:
            del tracked[pid]
    grew = True
    while grew:
        grew = False
        for pid, (ppid, born) in table.items():
            if ppid in tracked and pid not in tracked and pid != os.getpid():
                tracked[pid] = born
                grew = True


def _marked(mark: bytes) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    out.append(int(name))
        except OSError:  # gone, or not ours
            continue
    return out


def _reap(driver: int, token: str) -> None:
    """The reaper process (see `Reaper`)."""
    born = process_start_time(driver)
    runs: list[tuple[str, bool]] = []
    tracked: dict[int, str] = {}  # Ray's processes: pid -> start time
    pending, clean = b"", False
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        _follow(tracked)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                words = line.decode().split()
                if words[:1] == ["run"] and len(words) == 3:
                    runs.append((words[1], words[2] == "1"))
                if words[:1] == ["roots"]:
                    tracked.update((int(w), t) for w in words[1:] if (t := process_start_time(int(w))) is not None)
                    _follow(tracked)
                clean = clean or words == ["bye"]
        elif born is None or process_start_time(driver) != born:  # also when a forked child still holds the pipe
            break
    mark = f"{REAP_ENV}={token}".encode()
    killed: set[int] = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        _follow(tracked)
        pids = sorted(set(tracked) | set(_marked(mark)))
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        killed.update(pids)
        time.sleep(0.2)
    if clean:
        return
    # after a crash: the local sandbox dirs of the dead processes (a zombie still counts as alive for
    # `prune_local_dirs`, so those of the processes killed here and of the driver go by pid) and the
    # Docker sandboxes of the watched runs
    code = ("import contextlib, glob, sys, tempfile\nfrom pathlib import Path\nfrom agentrl.sandboxes import admin\n"
            "from agentrl.sandboxes.local import TEMP_PREFIX, _force_rmtree\n"
            "for pid in sys.argv[1].split(','):\n"
            "    for path in glob.glob(f'{tempfile.gettempdir()}/{TEMP_PREFIX}{pid}-*'):\n"
            "        with contextlib.suppress(Exception): _force_rmtree(Path(path))\n"
            "with contextlib.suppress(Exception): admin.prune_local_dirs()\n"
            "for run in sys.argv[2:]:\n    with contextlib.suppress(Exception): admin.prune(run_id=run)\n")
    dead = ",".join(map(str, sorted(killed | {driver})))
    with contextlib.suppress(Exception):
        subprocess.run([sys.executable, "-c", code, dead, *(r for r, docker in runs if docker)], timeout=300,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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


if __name__ == "__main__" and sys.argv[1:2] == ["--reap"]:
    _reap(int(sys.argv[2]), sys.argv[3])
