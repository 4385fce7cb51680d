"""Intra-op threads: how many cores a thread's torch ops use, and OpenMP workers given back.

torch's CPU ops parallelise with OpenMP, whose thread count is per calling thread, so an engine's
worker thread and a learner's each set their own (`torch_threads`).

libgomp (torch's OpenMP on Linux) keeps a pool of worker threads for every thread that ever ran
a parallel region, and counts the workers of all of them: once they outnumber the cores, every
team stops spin-waiting between regions and sleeps, so each region pays a futex wake-up. A decode
step is ~1 000 small regions. SmolLM2-135M, 8 rows, bf16, on the 2-core EPYC: 38-41 ms a step on
one thread, 29-32 ms on two, and 50-58 ms on two once one other thread (the main one, which loaded
the model) held a pool of its own; the hf engine decoded 152-167 tokens/s on one thread, 110-122 on
two with that pool, 198-208 on two without it. So a thread that has finished its parallel work gives its
workers back (`release_idle_workers`), and only the engine keeps a pool while it decodes."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import torch

T = TypeVar("T")

OMP_PAUSE_SOFT = 1  # OpenMP 5's omp_pause_soft: the pool's threads exit, state is kept


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block on `threads` intra-op threads (None: as set), restored after it. A thread
    that has set its count keeps it whatever other threads set (an engine's and a learner's worker
    threads each their own), but one that never has follows libgomp's default, which a set on any
    such thread moves: where the count matters, set it (`policy.LearnerStepPolicy` does, always)."""
    if threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@functools.cache
def _torch_libgomp() -> ctypes.CDLL | None:
    """torch's own libgomp, as loaded in this process (another package may load a second copy,
    sentencepiece does, whose pools are not torch's), or None (another OpenMP, or none)."""
    torch_lib = str(Path(torch.__file__).resolve().parent / "lib")
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if path.startswith(torch_lib) and Path(path).name.startswith("libgomp"):
                    return ctypes.CDLL(path)
    except OSError:  # no /proc (not Linux)
        pass
    return None


def release_idle_workers() -> bool:
    """Let the calling thread's OpenMP workers exit (`omp_pause_resource_all(omp_pause_soft)`),
    so that they no longer count against the cores (module docstring); the next parallel region
    on this thread starts them again (tens of microseconds). Returns whether torch's libgomp was
    found (elsewhere: False, nothing done)."""
    gomp = _torch_libgomp()
    if gomp is None:
        return False
    gomp.omp_pause_resource_all(OMP_PAUSE_SOFT)
    return True


def _then_release(fn: Callable[..., T], *args: object) -> T:
    try:
        return fn(*args)
    finally:
        release_idle_workers()


async def to_thread_releasing(fn: Callable[..., T], *args: object) -> T:
    """`asyncio.to_thread(fn, *args)` for parallel work (a learner step, a weight copy): the
    worker thread gives its OpenMP workers back when `fn` returns, so the pools of the default
    executor's threads do not linger beside the engine's."""
    return await asyncio.to_thread(_then_release, fn, *args)


@contextlib.contextmanager
def threads_per_block(model: torch.nn.Module, count: Callable[[], int]) -> Iterator[None]:
    """While the block runs, the model's repeated blocks (the children of its ModuleLists: a
    transformer's layers) set the calling thread's intra-op count to `count()` before their
    forward and before their backward, so a learner step takes the cores an engine beside it
    leaves idle from the next layer on. The backward runs on the calling thread on CPU, and its
    point is a hook on each block's output gradient."""
    blocks = [block for module in model.modules() if isinstance(module, torch.nn.ModuleList) for block in module]

    def set_count(*_: object) -> None:
        n = count()
        if n != torch.get_num_threads():
            torch.set_num_threads(n)

    def before_backward(_module: torch.nn.Module, _args: object, output: object) -> None:
        out = output[0] if isinstance(output, tuple) else output
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(set_count)  # returns None: the gradient passes unchanged

    handles = [h for block in blocks for h in (block.register_forward_pre_hook(set_count),
                                               block.register_forward_hook(before_backward))]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
