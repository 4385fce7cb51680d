"""The CPU process's memory: freed heap handed back to the OS, bounded kernel caches, mapped tensors.

glibc keeps memory that Python and torch free in its arenas, and raises its mmap threshold after
each large free, so the weight-sized tensors of one phase (a model loaded and then shared, the
warm start's Adam moments, one learner step's gradients and activations) stay in the process's
RSS after they are freed, and the next phase's peak stacks on that slack. `malloc_trim(0)` returns
free pages from every arena (madvise), a few milliseconds at the points where a phase ends.

oneDNN's kernel caches are bounded too (`bound_kernel_caches`, which the hf engine and the learner
call before their first kernel; importing this module does nothing): torch's bf16 matmuls on CPU
go through ideep and oneDNN, which each keep the kernels they built in an LRU of 1 024 entries by
default, keyed by the exact shapes. An engine's decode
step attends over one more cached token than the step before, so every step builds new kernels
and the caches fill with about 1.1 MB per shape that is never used again: the held-out
evaluation's replay (24 requests, contexts up to 3k tokens) held 0.55 GB in them after it ended,
and its peak added 1.57 GB over what it entered with instead of 0.63 (docs/benchmarks.md, Memory)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
from collections.abc import Iterator
from typing import Any


@functools.cache
def _libc(function: str) -> Any:
    """A glibc function (`malloc_trim`, `mallopt`), or None where the C library lacks it (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), function) if name else None
    except (OSError, AttributeError):
        return None


def trim_heap() -> bool:
    """Return the allocator's free memory to the OS; False where the C library cannot."""
    trim = _libc("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


# ideep's (LRU_CACHE_CAPACITY) and oneDNN's (ONEDNN_PRIMITIVE_CACHE_CAPACITY) kernel caches, in
# entries. A step's shapes repeat within it (every layer) and its linear layers' between steps,
# which a few dozen entries hold; 0 is not allowed (ideep crashes with LRU_CACHE_CAPACITY=0).
KERNEL_CACHE_CAPACITY = 64
KERNEL_CACHE_VARIABLES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def bound_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> dict[str, str]:
    """Cap ideep's and oneDNN's kernel caches at `capacity` entries unless the environment already
    sets them. Both read their variable once, when the process builds its first kernel, so this
    must run before the first bf16 matmul: the hf engine and the learner call it as they are built.
    Returns the values in force."""
    if capacity < 1:
        raise ValueError(f"kernel cache capacity must be >= 1, got {capacity}")
    return {name: os.environ.setdefault(name, str(capacity)) for name in KERNEL_CACHE_VARIABLES}



# glibc's mallopt parameter (malloc.h) and the thresholds the learner's phases use.
M_MMAP_THRESHOLD = -3
LEARNER_MMAP_THRESHOLD = 128 << 10  # glibc's initial value: every tensor of a step gets its own mapping
DYNAMIC_MMAP_THRESHOLD_MAX = 32 << 20  # where glibc's sliding threshold ends up after large frees (64-bit)


@contextlib.contextmanager
def mapped_tensors(threshold: int = LEARNER_MMAP_THRESHOLD) -> Iterator[None]:
    """Inside the block every allocation of `threshold` bytes or more is its own mmap, unmapped
    when freed. A learner step allocates and frees activations and gradients of a few MB each;
    with glibc's sliding threshold (up to 32 MiB once a large chunk was freed) they land in the
    heap and fragment it (the default swe run's warm start peaked at 5.31 GB without this block,
    4.42 GB with it — docs/benchmarks.md, Memory). Not for the engines: a decode step's fresh
    mappings fault their pages in each time (an evaluation took 1.6x as long with the threshold
    fixed for the whole run), and the threshold is the whole process's, so not while an engine
    decodes in another thread either. After the block the threshold stays fixed where glibc's
    own would have slid to."""
    if not set_mmap_threshold(threshold):  # not glibc: nothing to tune
        yield
        return
    try:
        yield
    finally:
        set_mmap_threshold(DYNAMIC_MMAP_THRESHOLD_MAX)


def set_mmap_threshold(threshold: int) -> bool:
    """Fix glibc's mmap threshold for the whole process (a learner rank's process only learns);
    False where the C library has no mallopt."""
    mallopt = _libc("mallopt")
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, threshold))
