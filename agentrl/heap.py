"""Hand freed heap memory back to the OS.

glibc keeps memory that Python and torch free in its arenas, and raises its mmap threshold after
each large free, so the weight-sized tensors of one phase (a model loaded and then shared, the
warm start's Adam moments, one learner step's gradients and activations) stay in the process's
RSS after they are freed, and the next phase's peak stacks on that slack. `malloc_trim(0)` returns
free pages from every arena (madvise), a few milliseconds at the points where a phase ends."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim() -> object | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


def trim_heap() -> bool:
    """Return the allocator's free memory to the OS; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
