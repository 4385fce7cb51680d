"""Host buffers for the relay whose pages outlive them, so a push writes into warm memory.

A push copies a complete version into a new buffer, and the first write to every page of a new
mapping is a page fault: on a VM that costs several times the copy itself (`bench/controller.py`
reports both bandwidths). The superseded version's buffer is free once no engine holds a view
of it any more, which is exactly when the next push needs one of the same size. So a buffer's
mapping is not unmapped when its last view goes: it goes back to its pool, advised
`MADV_FREE` — the kernel may take the pages back under memory pressure, and until it does the
next push reuses them without faulting. At rest the node holds one copy of the weights it can
not give back, and at most one it can.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import weakref
from typing import Any

import numpy as np
import torch

# Below this a buffer is not worth its own mapping: the allocator serves it.
MIN_POOLED_BYTES = 1 << 20
# libc's madvise through ctypes, which drops the GIL for the call: advising gigabytes walks every
# page (0.15 s a GB on the CI VM), and the event loop must not wait on that (mmap.madvise holds
# the GIL).
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class _Lease:
    """The one object every view of a pooled buffer keeps alive (numpy records it as the array's
    base); when it goes, the buffer has no views left and its mapping returns to the pool."""

    def __init__(self, address: int, size: int) -> None:
        self.__array_interface__ = {"data": (address, False), "shape": (size,), "typestr": "|u1",
                                    "version": 3}


class HostBufferPool:
    """Hands out uint8 buffers; keeps the mapping of the latest one released for the next `take`
    of the same size. Thread-safe: a buffer's last view may go on any thread."""

    def __init__(self) -> None:
        self._free: tuple[mmap.mmap, int, int] | None = None  # (mapping, address, size)
        self._advising = 0  # released buffers whose pages are still being advised
        self._settled = threading.Condition()
        self.stats = {"fresh": 0, "reused": 0}
        self._can_lend = hasattr(mmap, "MADV_FREE")  # Linux and the BSDs; elsewhere, plain buffers

    def take(self, size: int) -> torch.Tensor:
        """A writable buffer of `size` bytes; its contents are undefined. It may wait for a buffer
        just released to be advised (a fresh mapping faulted in meanwhile would contend with that
        for the same page tables), so call it off the event loop."""
        if size < MIN_POOLED_BYTES or not self._can_lend:
            self.stats["fresh"] += 1
            return torch.empty(size, dtype=torch.uint8)
        with self._settled:
            self._settled.wait_for(lambda: self._advising == 0)
            free, self._free = self._free, None
        if free is not None and free[2] == size:
            region, address, _ = free
            self.stats["reused"] += 1
        else:
            if free is not None:
                free[0].close()
            region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            pin = ctypes.c_char.from_buffer(region)
            address = ctypes.addressof(pin)
            del pin  # the address stays valid while `region` is mapped; no export is left open
            self.stats["fresh"] += 1
        lease = _Lease(address, size)
        finalizer = weakref.finalize(lease, _released, weakref.ref(self), region, address, size)
        finalizer.atexit = False
        return torch.from_numpy(np.asarray(lease))

    def release(self, region: mmap.mmap, address: int, size: int) -> None:
        """A buffer's last view went, on whatever thread dropped it (an engine's, the event
        loop's): advise its pages and pool them on a thread of their own."""
        with self._settled:
            self._advising += 1
        threading.Thread(target=self._give_back, args=(region, address, size), daemon=True,
                         name="relay-spare").start()

    def _give_back(self, region: mmap.mmap, address: int, size: int) -> None:
        kept = older = None
        try:
            if _LIBC.madvise(address, size, mmap.MADV_FREE) == 0:
                kept = (region, address, size)
        finally:
            with self._settled:
                if kept is not None:
                    older, self._free = self._free, kept
                self._advising -= 1
                self._settled.notify_all()
        if older is not None:  # only the latest released buffer is kept
            older[0].close()
        if kept is None:
            region.close()

    def close(self) -> None:
        """Unmap the spare now (a relay that stops)."""
        with self._settled:
            free, self._free = self._free, None
        if free is not None:
            free[0].close()

    @property
    def spare_bytes(self) -> int:
        free = self._free
        return free[2] if free is not None else 0


def _released(pool_ref: Any, region: mmap.mmap, address: int, size: int) -> None:
    pool = pool_ref()
    if pool is None:
        region.close()
    else:
        pool.release(region, address, size)
