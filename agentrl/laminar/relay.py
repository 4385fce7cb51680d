"""Relay tier: versioned weights in host memory, passed along a chain in chunks.

Laminar (arXiv 2510.12633) §3.1–3.2 and App. D; algorithms.md §1.2. The trainer pushes to the
master relay and goes on at once (its stall is the copy into the master's buffer); the master
streams the bytes down a chain of relays chunk by chunk, each relay forwarding a chunk as soon
as it has stored it (pipelining); rollout workers fetch from their own relay. When a relay dies
its predecessor sees the failed call at once, skips it and resends to the next survivor.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import hashlib
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agentrl.inference.cpu.threads import to_thread_releasing
from agentrl.laminar.host_buffers import HostBufferPool
from agentrl.laminar.runtime import ActorDied, InStore, put_for
from agentrl.laminar.types import FetchPolicy
from agentrl.phases import track

# ---------------------------------------------------------------------------------------------
# Latency model (App. D, algorithms.md §1.2): p nodes in a chain, M bytes in k chunks.
# ---------------------------------------------------------------------------------------------


def _check_chain(p: int, m: float, t_byte: float, t_start: float) -> None:
    if p < 2:
        raise ValueError(f"a chain needs p >= 2 nodes (master plus relays), got {p}")
    if m <= 0 or t_byte < 0 or t_start <= 0:
        raise ValueError(f"need M > 0, T_byte >= 0, T_start > 0; got {m}, {t_byte}, {t_start}")


def broadcast_time(p: int, k: int, m: float, t_byte: float, t_start: float) -> float:
    """T(p,k) = (p+k−2)·(M/k·T_byte + T_start): the last chunk leaves the master after k hops
    and needs p−2 more to reach the tail (Laminar App. D; algorithms.md §1.2)."""
    _check_chain(p, m, t_byte, t_start)
    if k < 1:
        raise ValueError(f"chunk count k must be >= 1, got {k}")
    return (p + k - 2) * (m / k * t_byte + t_start)


def optimal_chunks(p: int, m: float, t_byte: float, t_start: float) -> float:
    """k* = sqrt((p−2)·M·T_byte / T_start), the minimiser of T(p,k) over real k (§1.2)."""
    _check_chain(p, m, t_byte, t_start)
    return math.sqrt((p - 2) * m * t_byte / t_start)


def optimal_broadcast_time(p: int, m: float, t_byte: float, t_start: float) -> float:
    """T*(p) = M·T_byte + (p−2)·T_start + 2·sqrt((p−2)·M·T_byte·T_start) (§1.2)."""
    _check_chain(p, m, t_byte, t_start)
    return m * t_byte + (p - 2) * t_start + 2 * math.sqrt((p - 2) * m * t_byte * t_start)


def best_chunk_count(p: int, m: float, t_byte: float, t_start: float) -> int:
    """The integer k >= 1 next to k* with the smallest T(p,k)."""
    k = optimal_chunks(p, m, t_byte, t_start)
    options = {max(1, math.floor(k)), max(1, math.ceil(k))}
    return min(options, key=lambda c: broadcast_time(p, c, m, t_byte, t_start))


# ---------------------------------------------------------------------------------------------
# Weights as one flat byte buffer, so chunks are byte ranges and a relay copy is one memcpy.
# ---------------------------------------------------------------------------------------------

_ALIGN = 64  # every tensor starts on a 64-byte boundary so dtype views are legal


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # e.g. "float32"
    shape: tuple[int, ...]
    offset: int  # bytes into the flat buffer
    nbytes: int


@dataclass(frozen=True)
class WeightMeta:
    """What a relay needs to lay out a push before any of its bytes arrive (a streamed push,
    `Relay.begin_push`): the tensor's name, shape and dtype, and the name of the tensor it is
    (tied weights), if it is another's."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    same_as: str | None = None


def tie_key(t: torch.Tensor) -> tuple[Any, ...]:
    """Equal for two names that are one tensor (tied weights): the same bytes seen the same way."""
    return (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride())


def layout(state_dict: dict[str, torch.Tensor],
           dtypes: Mapping[str, str] | None = None) -> tuple[tuple[TensorSpec, ...], int]:
    """Where each tensor lives in the flat buffer, and the buffer's size in bytes. `dtypes` names
    the tensors stored in another dtype than they arrive in (cast while copied: the engines'
    forward precision, `HFEngine.weight_dtypes`). Names that are the same tensor (tied weights: a
    causal LM's `lm_head.weight` is its embedding matrix) share one byte range, so the buffer
    holds every distinct tensor once."""
    metas, first = [], {}  # (address, dtype, shape, strides) -> the first name seen there
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state_dict[{name!r}] is {type(t).__name__}, expected a torch.Tensor")
        same_as = first.setdefault(tie_key(t), name) if t.numel() and t.data_ptr() else name
        metas.append(WeightMeta(name, tuple(t.shape), str(t.dtype).removeprefix("torch."),
                                same_as if same_as != name else None))
    return layout_meta(metas, dtypes)


def layout_meta(metas: list[WeightMeta],
                dtypes: Mapping[str, str] | None = None) -> tuple[tuple[TensorSpec, ...], int]:
    """`layout` from the tensors' descriptions alone (a streamed push lays out its buffer before
    the first chunk arrives); a name `same_as` another shares that one's byte range."""
    specs, offset = [], 0
    placed: dict[tuple[str, str, tuple[int, ...]], int] = {}  # (first name, dtype, shape) -> offset
    for m in metas:
        dtype = (dtypes or {}).get(m.name) or m.dtype
        nbytes = math.prod(m.shape) * getattr(torch, dtype).itemsize
        key = (m.same_as or m.name, dtype, m.shape)
        at = placed.get(key) if nbytes else None
        if at is None:
            at = placed[key] = offset
            offset += -(-nbytes // _ALIGN) * _ALIGN
        specs.append(TensorSpec(m.name, dtype, m.shape, at, nbytes))
    return tuple(specs), offset


@dataclass(frozen=True)
class WireTensor:
    """A host tensor on its way to a relay: its bytes as a uint8 numpy array, which Ray sends out
    of band (one copy into the object store, mapped on the other side), where it pickles a torch
    tensor by value (3-5 s a GB against 0.1-0.5 s measured here); or, for a tied name, the name
    whose bytes it shares."""

    data: np.ndarray | None
    dtype: str
    shape: tuple[int, ...]
    same_as: str | None = None


def to_wire(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Host tensors as `WireTensor`s (views, no copy), tied names as references to the first name
    holding their bytes; a device tensor (a GPU learner's) passes as it is."""
    wire: dict[str, Any] = {}
    first: dict[tuple[Any, ...], str] = {}
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            wire[name] = t
            continue
        t = t.detach()
        dtype, shape = str(t.dtype).removeprefix("torch."), tuple(t.shape)
        key = tie_key(t)
        if t.numel() and key in first:
            wire[name] = WireTensor(None, dtype, shape, same_as=first[key])
        else:
            first[key] = name
            wire[name] = WireTensor(t.contiguous().reshape(-1).view(torch.uint8).numpy(), dtype, shape)
    return wire


def from_wire(wire: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors `to_wire` sent, as views of the received bytes; tied names are one tensor again."""
    out: dict[str, torch.Tensor] = {}
    for name, w in wire.items():
        if not isinstance(w, WireTensor):
            out[name] = w
        elif w.same_as is not None:
            out[name] = out[w.same_as]
        elif w.data.size == 0:  # no bytes to view
            out[name] = torch.empty(w.shape, dtype=getattr(torch, w.dtype))
        else:
            out[name] = read_only_tensor(w.data).view(getattr(torch, w.dtype)).view(w.shape)
    return out


def flatten_into(state_dict: Mapping[str, torch.Tensor], specs: tuple[TensorSpec, ...],
                 flat: torch.Tensor) -> None:
    """Copy every tensor into its byte range of `flat` (the real copy of a push; a cast to the
    spec's dtype happens in the same copy); a range two tied names share is copied once. `specs`
    may be a part of the layout (a streamed push copies one chunk of names at a time)."""
    done: set[int] = set()
    for s in specs:
        if s.nbytes and s.offset in done:
            continue
        done.add(s.offset)
        src = state_dict[s.name].detach().reshape(-1)
        dst = flat[s.offset:s.offset + s.nbytes]
        if src.dtype == getattr(torch, s.dtype):
            dst.copy_(src.contiguous().view(torch.uint8))
        else:
            dst.view(getattr(torch, s.dtype)).copy_(src)


class ReadOnlyWeights(dict):  # type: ignore[type-arg]
    """A state dict whose tensors nobody writes again (a relay's complete snapshot: a new version
    goes into a new buffer). An in-process engine may take them as its parameters instead of
    copying them (HFEngine.load_weights), so a one-process run keeps one copy of the rollout
    weights, not the relay's and the engine's."""

    read_only = True


def unflatten(specs: tuple[TensorSpec, ...], flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views into `flat` (no copy); an engine's load_weights copies or shares them."""
    return {s.name: flat[s.offset:s.offset + s.nbytes].view(getattr(torch, s.dtype)).view(s.shape)
            for s in specs}


class WeightSnapshot:
    """One complete version of the weights, as held by a relay: its bytes are one flat buffer laid
    out by `specs` (a relay's own copy), or the tensors a pusher put in the object store, served as
    they were pushed (`Relay.push` of an `InStore`: no relay copies them). On Ray (`stored`, the
    object store's reference) a worker that fetches it receives the reference, not the bytes, and
    maps that one copy (`resolve`), so a push leaves one copy per node however many workers pull it."""

    def __init__(self, version: int, specs: tuple[TensorSpec, ...], nbytes: int, flat: torch.Tensor | None = None,
                 tensors: dict[str, torch.Tensor] | None = None, stored: Any = None) -> None:
        self.version = version
        self.specs = specs
        self.nbytes = nbytes  # of the flat layout
        self._flat = flat
        self._tensors = tensors
        self.stored = stored

    @property
    def flat(self) -> torch.Tensor:
        if self._flat is None:
            raise RuntimeError("this snapshot holds its tensors as pushed, not a flat buffer" if self._tensors
                               else "a stored snapshot's bytes are mapped by `await snapshot.resolve()` first")
        return self._flat

    async def resolve(self) -> WeightSnapshot:
        """Map the bytes of a snapshot that arrived as an object-store reference (zero-copy on its
        node, read-only); a no-op for one that holds its bytes."""
        if self._flat is None and self._tensors is None:
            value = await self.stored
            if isinstance(value, np.ndarray):
                self._flat = read_only_tensor(value)
            else:
                self._tensors = from_wire(value)
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # to another process: a stored snapshot travels as its reference, never as its bytes
        if self.stored is not None:
            return (WeightSnapshot, (self.version, self.specs, self.nbytes, None, None, self.stored))
        return (WeightSnapshot, (self.version, self.specs, self.nbytes, self._flat, self._tensors))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Views of this version's bytes, which nobody writes again once the version is complete."""
        if self._tensors is not None:
            return ReadOnlyWeights({s.name: self._tensors[s.name] for s in self.specs})
        return ReadOnlyWeights(unflatten(self.specs, self.flat))

    def held(self) -> list[torch.Tensor]:
        """The tensors holding this version's bytes (memory accounting): the flat buffer, or the
        tensors as pushed; none before a stored snapshot is resolved."""
        if self._tensors is not None:
            return list(self._tensors.values())
        return [self._flat] if self._flat is not None else []

    def bytes_at(self, start: int, end: int) -> np.ndarray:
        """Bytes [start, end) of the flat layout (a chunk for the next relay)."""
        if self._tensors is not None:
            return gather_laid_out(self._placed, self._tensors, start, end)
        return self.flat.numpy()[start:end]

    @functools.cached_property
    def _placed(self) -> tuple[TensorSpec, ...]:
        """The specs that own a byte range (a tied name shares its first name's), by offset."""
        return tuple(sorted({s.offset: s for s in self.specs if s.nbytes}.values(), key=lambda s: s.offset))

    def checksum(self, step: int = 64 << 20) -> str:
        """`checksum` of the flat layout, whichever form holds the bytes."""
        if self._tensors is None:
            return checksum(self.flat)
        digest = hashlib.sha1()
        for start in range(0, self.nbytes, step):
            digest.update(memoryview(self.bytes_at(start, min(self.nbytes, start + step))))
        return digest.hexdigest()


def gather_laid_out(placed: tuple[TensorSpec, ...], tensors: Mapping[str, torch.Tensor], start: int,
                    end: int) -> np.ndarray:
    """Bytes [start, end) of the flat buffer laid out by `placed` (the specs owning a byte range,
    by offset), copied from the tensors themselves (padding is zero): a relay serving a version as
    pushed forwards it down the chain this way."""
    out = np.zeros(end - start, dtype=np.uint8)
    first = max(0, bisect.bisect_right(placed, start, key=lambda s: s.offset) - 1)
    for s in placed[first:]:
        if s.offset >= end:
            break
        lo, hi = max(start, s.offset), min(end, s.offset + s.nbytes)
        if lo < hi:
            src = tensors[s.name].detach().reshape(-1).view(torch.uint8).numpy()
            out[lo - start:hi - start] = src[lo - s.offset:hi - s.offset]
    return out


def laid_out_as_pushed(tensors: Mapping[str, torch.Tensor], specs: tuple[TensorSpec, ...]) -> bool:
    """Whether every tensor is in host memory and already in its spec's dtype (a relay can serve
    them as they are: no cast to make, nothing to bring to the host)."""
    return all(tensors[s.name].device.type == "cpu" and str(tensors[s.name].dtype).removeprefix("torch.") == s.dtype
               for s in specs)


def read_only_tensor(array: np.ndarray) -> torch.Tensor:
    """A uint8 tensor over a read-only buffer (the object store's copy): nothing writes a
    complete version again (`ReadOnlyWeights`), so torch's warning about it is moot here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def put_in_object_store(flat: torch.Tensor) -> Any:
    """Copy a complete version into this node's Ray object store once; its reference."""
    import ray  # optional dependency: only relays spawned on the Ray runtime get here

    return ray.put(flat.numpy())


def checksum(flat: torch.Tensor) -> str:
    return hashlib.sha1(memoryview(flat.numpy())).hexdigest()


@dataclass
class _Incoming:
    """A version being received: its buffer and which chunks have landed."""

    version: int
    specs: tuple[TensorSpec, ...]
    flat: torch.Tensor
    n_chunks: int
    chunk_bytes: int
    have: set[int] = field(default_factory=set)
    started: float = field(default_factory=time.perf_counter)

    @property
    def nbytes(self) -> int:
        return self.flat.numel()

    def bytes_at(self, start: int, end: int) -> np.ndarray:
        return self.flat.numpy()[start:end]


# ---------------------------------------------------------------------------------------------
# The relay
# ---------------------------------------------------------------------------------------------


class Relay:
    """Holds the latest complete weights and forwards new ones down the chain.

    Methods are async so the same class runs as a local object or as an async Ray actor;
    `downstream` handles are other relays (`await handle.receive_chunk(...)`).
    """

    def __init__(self, relay_id: str, chunk_bytes: int = 16 * 1024 * 1024,
                 hop_delay_s: float = 0.0, object_store: bool = False) -> None:
        """`object_store` (a relay actor on Ray): every complete version moves into the node's
        object store, the one copy its workers map (`WeightSnapshot.resolve`)."""
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        self.id = relay_id
        self.chunk_bytes = chunk_bytes
        self.hop_delay_s = hop_delay_s  # simulated per-chunk start-up cost T_start (tests, benches)
        self.object_store = object_store
        self._complete: WeightSnapshot | None = None
        self._incoming: dict[int, _Incoming] = {}
        self._streaming: tuple[int, tuple[TensorSpec, ...], torch.Tensor, float] | None = None  # begin_push
        self._announced = -1
        self._done = asyncio.Condition()
        self._downstream: list[Any] = []  # handles, successor first
        self._queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        self._forwarder: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        # One host buffer at rest: the complete version's. A push fills another while the old
        # is still served; once superseded and no engine holds a view of it, the old one's pages
        # go back to the pool lazily freed, for the next push to write into warm (host_buffers.py).
        self._buffers = HostBufferPool()
        self.stats: dict[str, Any] = {"received_versions": [], "broadcast_s": {}, "completed_at": {},
                                      "failovers": 0, "served_as_pushed": 0}
        track("relay_buffers", self, lambda r: [*(r._complete.held() if r._complete else []),
                                                 *(i.flat for i in list(r._incoming.values())),
                                                 *([r._streaming[2]] if r._streaming else [])])

    # -- topology ------------------------------------------------------------------------------

    async def set_downstream(self, downstream: list[Any]) -> None:
        """The relays after this one, successor first. A new successor that lags gets our
        latest complete version resent (chain repair)."""
        old = self._downstream[0].name if self._downstream else None
        self._downstream = list(downstream)
        self._ensure_forwarder()
        if self._downstream and self._downstream[0].name != old and self._complete is not None:
            self._enqueue_all(self._complete.version, self._n_chunks(self._complete.nbytes))

    async def _buffer(self, size: int) -> torch.Tensor:
        return await asyncio.to_thread(self._buffers.take, size)

    async def ping(self) -> str:
        return self.id

    # -- the master's side ---------------------------------------------------------------------

    async def push(self, state_dict: dict[str, Any] | InStore, version: int,
                   dtypes: Mapping[str, str] | None = None) -> float:
        """Copy the weights into a fresh host buffer (the names in `dtypes` cast to theirs), start
        the broadcast, return the copy's seconds (the trainer's whole stall, §1.2 ⑤).

        Weights the pusher put in the object store (`InStore`, on Ray) are served as they are when
        nothing needs a cast: the pusher's put was the node's one copy, and this relay keeps its
        reference instead of copying the bytes twice more (into its buffer and into the store)."""
        self._check_newer(version)
        t0 = time.perf_counter()
        stored = state_dict.ref if isinstance(state_dict, InStore) else None
        tensors = from_wire(await stored if stored is not None else state_dict)
        specs, size = layout(tensors, dtypes)
        if stored is not None and self.object_store and laid_out_as_pushed(tensors, specs):
            self.stats["served_as_pushed"] += 1
            snap = WeightSnapshot(version, specs, size, tensors=tensors, stored=stored)
            await self._complete_version(snap, t0)
            return self._broadcast(version, self._n_chunks(size), time.perf_counter() - t0)
        flat = await self._buffer(size)
        await to_thread_releasing(flatten_into, tensors, specs, flat)
        return await self._publish(version, specs, flat, time.perf_counter() - t0)

    def _check_newer(self, version: int) -> None:
        if self._complete is not None and version <= self._complete.version:
            raise ValueError(f"relay {self.id}: pushed version {version} is not newer than "
                             f"{self._complete.version}")

    async def begin_push(self, metas: list[WeightMeta], version: int,
                         dtypes: Mapping[str, str] | None = None) -> None:
        """A streamed push: lay out and allocate the buffer from the tensors' descriptions; the
        bytes follow in parts (`push_part`), and `end_push` publishes the version. A sharded
        learner gathers its weights a chunk at a time this way, so no process holds a full copy
        besides this buffer."""
        self._check_newer(version)
        specs, size = layout_meta(metas, dtypes)
        self._streaming = (version, specs, await self._buffer(size), 0.0)

    async def push_part(self, version: int, part: dict[str, torch.Tensor]) -> None:
        """Copy one part of a streamed push (any subset of its names) into the buffer."""
        if self._streaming is None or self._streaming[0] != version:
            raise ValueError(f"relay {self.id}: push_part for version {version} without its begin_push")
        _, specs, flat, copy_s = self._streaming
        t0 = time.perf_counter()
        part = from_wire(part)
        await to_thread_releasing(flatten_into, part, tuple(s for s in specs if s.name in part), flat)
        self._streaming = (version, specs, flat, copy_s + time.perf_counter() - t0)

    async def end_push(self, version: int) -> float:
        """Publish a streamed push; returns the seconds its parts took to copy."""
        if self._streaming is None or self._streaming[0] != version:
            raise ValueError(f"relay {self.id}: end_push for version {version} without its begin_push")
        _, specs, flat, copy_s = self._streaming
        self._streaming = None
        return await self._publish(version, specs, flat, copy_s)

    async def _publish(self, version: int, specs: tuple[TensorSpec, ...], flat: torch.Tensor,
                       copy_s: float) -> float:
        """A complete new version in `flat`: make it the served one and start its broadcast."""
        n = self._n_chunks(flat.numel())
        self._incoming[version] = _Incoming(version, specs, flat, n, self.chunk_bytes, set(range(n)))
        await self._finish(version)
        return self._broadcast(version, n, copy_s)

    def _broadcast(self, version: int, n_chunks: int, copy_s: float) -> float:
        """Send the complete version `version`, `n_chunks` chunks, down the chain; returns `copy_s`."""
        self._announced = max(self._announced, version)
        # a tiny message to every relay so their waiting workers know v is on its way
        self._tasks.add(asyncio.ensure_future(asyncio.gather(
            *(self._quiet(h.announce(version)) for h in self._downstream))))
        self._enqueue_all(version, n_chunks)
        return copy_s

    async def _quiet(self, call: Any) -> None:
        with contextlib.suppress(ActorDied):
            await call

    # -- the receiving side --------------------------------------------------------------------

    async def announce(self, version: int) -> None:
        self._announced = max(self._announced, version)

    async def receive_chunk(self, version: int, index: int, n_chunks: int,
                            specs: tuple[TensorSpec, ...], total: int, data: np.ndarray) -> None:
        """Store one chunk and queue it for the successor; duplicates (after a repair) are
        ignored, older versions than the complete one are dropped."""
        if self._complete is not None and version <= self._complete.version:
            return
        if version not in self._incoming:
            flat = await self._buffer(total)
            if self._complete is not None and version <= self._complete.version:
                return  # completed or superseded while the buffer was found
            if version not in self._incoming:  # or another chunk of it got there first
                self._incoming[version] = _Incoming(version, specs, flat, n_chunks, self.chunk_bytes)
            self._announced = max(self._announced, version)
        inc = self._incoming[version]
        if index in inc.have:
            return
        start = index * inc.chunk_bytes
        np.copyto(inc.flat.numpy()[start:start + data.size], data)  # the relay's own copy
        inc.have.add(index)
        self._queue.put_nowait((version, index))
        self._ensure_forwarder()
        if len(inc.have) == inc.n_chunks:
            await self._finish(version)

    async def _finish(self, version: int) -> None:
        inc = self._incoming[version]
        flat, stored = inc.flat, None
        if self._is_newer(version) and self.object_store:  # off the event loop: one memcpy of the whole version
            stored = await asyncio.to_thread(put_in_object_store, inc.flat)
            flat = read_only_tensor(await stored)  # the store's copy, mapped: what this relay serves
        # (the receive buffer is served until here: a chunk forwarded meanwhile still finds it)
        await self._complete_version(WeightSnapshot(version, inc.specs, inc.flat.numel(), flat, stored=stored),
                                     inc.started)

    def _is_newer(self, version: int) -> bool:
        return self._complete is None or version > self._complete.version

    async def _complete_version(self, snap: WeightSnapshot, started: float) -> None:
        """`snap` is complete here: serve it if it is the newest, drop what it supersedes, and
        wake the workers waiting for it."""
        self._incoming.pop(snap.version, None)
        for v in [v for v in self._incoming if v < snap.version]:  # superseded partial versions
            del self._incoming[v]
        if self._is_newer(snap.version):
            self._complete = snap
            self.stats["received_versions"].append(snap.version)
            self.stats["broadcast_s"][snap.version] = time.perf_counter() - started
            self.stats["completed_at"][snap.version] = time.perf_counter()
        async with self._done:
            self._done.notify_all()

    # -- forwarding ----------------------------------------------------------------------------

    def _n_chunks(self, size: int) -> int:
        return max(1, -(-size // self.chunk_bytes))

    def _enqueue_all(self, version: int, n: int) -> None:
        for i in range(n):
            self._queue.put_nowait((version, i))
        self._ensure_forwarder()

    def _ensure_forwarder(self) -> None:
        if self._forwarder is None or self._forwarder.done():
            self._forwarder = asyncio.ensure_future(self._forward_loop())

    def _source(self, version: int) -> WeightSnapshot | _Incoming | None:
        if self._complete is not None and self._complete.version == version:
            return self._complete
        return self._incoming.get(version)

    async def _forward_loop(self) -> None:
        while True:
            version, index = await self._queue.get()
            if not self._downstream:
                continue
            src = self._source(version)
            if src is None:  # superseded by a newer version
                continue
            total = src.nbytes
            # numpy, not a torch view: a pickled torch view would ship its whole storage (Ray)
            data = src.bytes_at(index * self.chunk_bytes, min(total, (index + 1) * self.chunk_bytes))
            if self.hop_delay_s:
                await asyncio.sleep(self.hop_delay_s)
            succ = self._downstream[0]
            try:
                await succ.receive_chunk(version, index, self._n_chunks(total), src.specs, total, data)
            except ActorDied:
                # O(1) repair: skip the dead successor and resend what it may not have passed on
                self._downstream.pop(0)
                self.stats["failovers"] += 1
                for i in range(index + 1) if self._downstream else ():
                    self._queue.put_nowait((version, i))

    # -- rollout side --------------------------------------------------------------------------

    async def latest_version(self) -> int:
        return self._complete.version if self._complete is not None else -1

    async def fetch_latest(self, have_version: int = -1, policy: FetchPolicy = "wait_inflight",
                           timeout_s: float = 60.0) -> WeightSnapshot | None:
        """The newest complete weights if newer than `have_version`, else None (§1.2 ⑦).

        `wait_inflight`: if a newer version was announced but has not fully arrived here,
        wait for it (up to `timeout_s`, then fall back to the local copy). `local`: never wait.
        """
        if policy not in ("wait_inflight", "local"):
            raise ValueError(f"unknown fetch policy {policy!r}; expected 'wait_inflight' or 'local'")
        if policy == "wait_inflight":
            async def arrived() -> None:
                async with self._done:
                    await self._done.wait_for(
                        lambda: self._complete is not None and self._complete.version >= self._announced)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(arrived(), timeout_s)
        snap = self._complete
        if snap is None or snap.version <= have_version:
            return None
        return snap

    async def checksum(self) -> tuple[int, str]:
        if self._complete is None:
            return -1, ""
        return self._complete.version, await to_thread_releasing(self._complete.checksum)

    async def get_stats(self) -> dict[str, Any]:
        return dict(self.stats, version=await self.latest_version(), announced=self._announced,
                    snapshot_bytes=self._complete.nbytes if self._complete is not None else 0,
                    buffers_allocated=sum(self._buffers.stats.values()),
                    buffers_reused=self._buffers.stats["reused"], spare_bytes=self._buffers.spare_bytes)

    async def stop(self) -> None:
        if self._forwarder is not None:
            self._forwarder.cancel()
        self._buffers.close()


class RelayChain:
    """The topology the manager owns: master first, then the chain; rebuilt on failures."""

    def __init__(self, relays: list[Any]) -> None:
        if not relays:
            raise ValueError("a relay chain needs at least one relay")
        self.relays = list(relays)

    @property
    def master(self) -> Any:
        return self.relays[0]

    async def build(self) -> None:
        for i, r in enumerate(self.relays):
            await r.set_downstream(self.relays[i + 1:])

    async def push(self, state_dict: dict[str, torch.Tensor], version: int,
                   dtypes: Mapping[str, str] | None = None) -> float:
        """Push to the master; if it is dead, elect the next relay as master and retry. On Ray the
        weights go into this node's object store once (`put_for`), and the master serves that copy."""
        t0 = time.perf_counter()
        payload = await asyncio.to_thread(put_for, self.master, to_wire(state_dict))
        put_s = time.perf_counter() - t0
        while self.relays:
            try:
                return put_s + await self.master.push(payload, version, dtypes)
            except ActorDied:
                await self.remove(self.master.name)
        raise ActorDied("every relay is dead")

    async def push_stream(self, metas: list[WeightMeta], parts: Callable[[], Iterator[dict[str, torch.Tensor]]],
                          version: int, dtypes: Mapping[str, str] | None = None) -> float:
        """`push` in parts (`Relay.begin_push`): `parts()` yields dicts of some of the weights
        (a sharded learner's gathered chunks; each call starts a new pass over them). It runs
        off the event loop, one part at a time; a master that dies mid-stream is replaced and
        the stream starts again from a new pass."""
        while self.relays:
            master = self.master
            try:
                await master.begin_push(metas, version, dtypes)
                stream = await asyncio.to_thread(parts)
                while (part := await asyncio.to_thread(next, stream, None)) is not None:
                    await master.push_part(version, to_wire(part))
                return await master.end_push(version)
            except ActorDied:
                await self.remove(master.name)
        raise ActorDied("every relay is dead")

    async def remove(self, name: str) -> None:
        """Drop a dead relay and rewire the survivors (O(1) per relay)."""
        self.relays = [r for r in self.relays if r.name != name]
        alive = []
        for r in self.relays:
            try:
                await r.ping()
                alive.append(r)
            except ActorDied:
                pass
        self.relays = alive
        await self.build()
