"""Phase marks for bench/memory.py: which phase of a run holds the memory peak, and what is resident.

`mark_phase` / `phase` name the phase a run is in and, when AGENTRL_PHASE_LOG is set (by
bench/memory.py), append a line with the time, this process's RSS and the bytes of the tensors
registered with `track` (learner weights, gradients, Adam state, engine weights and KV, relay
buffers). Unset (the default), marking costs nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

PHASE_LOG_ENV = "AGENTRL_PHASE_LOG"  # a file path; unset (the default): marking costs nothing
_tracked: list[tuple[str, Any, Callable[[Any], Iterable[Any]], bool]] = []  # (component, weakref, tensors of, views)
_current = "startup"
_lock = threading.Lock()


def track(component: str, owner: object, tensors: Callable[[Any], Iterable[Any]], views: bool = False) -> None:
    """Count `tensors(owner)` under `component` in every phase mark while `owner` lives (held by a
    weak reference). `views`: the tensors may be another component's memory (an engine running on
    the learner's parameters or a relay snapshot); such a component is counted after the owners,
    so shared storage is charged to its owner whatever the construction order. Only when a phase
    log is being written; a no-op otherwise."""
    if os.environ.get(PHASE_LOG_ENV):
        _tracked.append((component, weakref.ref(owner), tensors, views))


def component_bytes() -> dict[str, int]:
    """Bytes of the tracked components' tensor storages, each storage counted once: owners first,
    then the `views` components (an engine sharing the learner's parameters or the relay's
    snapshot adds 0)."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for component, ref, tensors, _ in sorted(_tracked, key=lambda entry: entry[3]):
        owner = ref()
        if owner is None:
            continue
        total = out.setdefault(component, 0)
        for _ in range(3):  # another thread may change a container while it is walked: retry
            try:
                items = list(tensors(owner))
                break
            except RuntimeError:
                items = []
        for t in items:
            if t is None:
                continue
            if t.is_mkldnn:  # an opaque oneDNN tensor (a packed weight) has no storage to share
                total += t.numel() * t.element_size()
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr and ptr not in seen:
                seen.add(ptr)
                total += storage.nbytes()
        out[component] = total
    return out


def mark_phase(name: str) -> str:
    """Note that the run enters phase `name` (one JSON line: wall time, phase, this process's RSS,
    the tracked components' bytes) when AGENTRL_PHASE_LOG names a file; returns the phase left."""
    global _current
    with _lock:
        left, _current = _current, name
        path = os.environ.get(PHASE_LOG_ENV)
        if path:
            line = {"t": time.time(), "phase": name, "rss": _self_rss(), "components": component_bytes()}
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
    return left


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """`mark_phase(name)` for the block, then back to the phase it interrupted."""
    left = mark_phase(name)
    try:
        yield
    finally:
        mark_phase(left)


def _self_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
