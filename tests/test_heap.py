"""trim_heap (agentrl/inference/cpu/memory.py): freed tensors that glibc keeps in its heap go back to the OS."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import torch

from agentrl.inference.cpu.memory import trim_heap


def test_trim_heap_returns_fragmented_free_memory() -> None:
    proc = psutil.Process()
    # A large free raises glibc's mmap threshold, so the next tensors come from the heap, and a
    # small live tensor after each keeps the heap from shrinking at its top when they are freed:
    # the pattern of a learner step's gradients and activations among longer-lived objects.
    big = [torch.ones(8_000_000) for _ in range(2)]
    del big
    freed, pins = [], []
    for _ in range(200):
        freed.append(torch.ones(400_000))  # 1.6 MB
        pins.append(torch.ones(1000))
    for t in freed:
        t.add_(1)  # touch every page
    before = proc.memory_info().rss
    del freed
    kept = proc.memory_info().rss
    assert trim_heap()
    after = proc.memory_info().rss
    assert kept - after > 0.5 * 200 * 1.6e6, (before >> 20, kept >> 20, after >> 20)
    assert len(pins) == 200


def test_mapped_tensors_give_freed_step_memory_back_without_a_trim() -> None:
    """The learner's phases run inside `mapped_tensors`: the same fragmenting pattern, but each
    tensor is its own mapping, so freeing them returns the memory at once (no trim, and it never
    piles up in the heap during the step). Outside the block the sliding threshold applies again.
    In a fresh interpreter: free chunks an earlier test left in the heap would be reused first."""
    script = """
import psutil, torch
from agentrl.inference.cpu.memory import mapped_tensors
proc = psutil.Process()
big = [torch.ones(8_000_000) for _ in range(2)]  # slides glibc's threshold up, as a loaded model does
del big
pins = []

def fragment():
    freed = []
    for _ in range(200):
        freed.append(torch.ones(400_000))  # 1.6 MB
        pins.append(torch.ones(1000))
    for t in freed:
        t.add_(1)
    kept = proc.memory_info().rss
    del freed, t
    return kept - proc.memory_info().rss  # what freeing gave back by itself

with mapped_tensors():
    inside = fragment()
outside = fragment()  # the threshold is fixed at 32 MiB again: 1.6 MB tensors come from the heap
print(inside, outside)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    inside, outside = map(int, out.stdout.split())
    assert inside > 0.8 * 200 * 1.6e6, inside >> 20
    assert outside < 0.2 * 200 * 1.6e6, outside >> 20


_KERNEL_CACHE_PROBE = """
import ctypes, json, sys
import torch
from agentrl.inference.cpu.memory import bound_kernel_caches

bound_kernel_caches()  # what the hf engine and the learner call first (unless the environment set them)

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
torch.set_num_threads(1)
q = torch.randn(4, 3, 3, 64).bfloat16()
before = libc.mallinfo2().uordblks
for length in range(200, 500):  # a decode step's shapes: one more cached key each time
    keys = torch.randn(4, 3, length, 64).bfloat16()
    weights = torch.softmax(torch.matmul(keys, q.transpose(-1, -2)).transpose(-1, -2).float(), -1).bfloat16()
    torch.matmul(weights, keys)
print(json.dumps(libc.mallinfo2().uordblks - before))
"""


def _kernel_cache_growth(env: dict[str, str]) -> int:
    clean = {k: v for k, v in os.environ.items() if k not in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", _KERNEL_CACHE_PROBE], env={**clean, **env}, capture_output=True,
                         text=True, check=True, timeout=300)
    return int(json.loads(out.stdout.strip().splitlines()[-1]))


def test_bounded_kernel_caches_keep_few_of_the_shapes_decode_steps_make() -> None:
    """300 bf16 matmul shapes, as 300 decode steps make: with torch's default caches (1 024
    entries) the process keeps what it built for each; with the bound `bound_kernel_caches` sets
    it keeps at most a few dozen shapes' worth."""
    import ctypes.util

    if not ctypes.util.find_library("c") or not hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallinfo2"):
        import pytest

        pytest.skip("glibc's mallinfo2 is needed to count the heap's live bytes")
    default = _kernel_cache_growth({"LRU_CACHE_CAPACITY": "1024", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"})
    if default < 50 << 20:
        import pytest

        pytest.skip(f"this CPU's bf16 matmuls keep no per-shape kernels ({default >> 20} MB for 300 shapes)")
    bounded = _kernel_cache_growth({})
    assert bounded < default / 3, (bounded >> 20, default >> 20)


def test_importing_the_cpu_modules_changes_nothing_in_the_process() -> None:
    """The CPU tuning acts only when called: importing every module of agentrl/inference/cpu sets
    no environment variable (the kernel-cache bounds are set by the engine and the learner)."""
    # torch's and transformers' own imports may set variables (TORCHINDUCTOR_*): taken before the snapshot
    script = ("import os, json, torch, transformers, transformers.masking_utils, transformers.cache_utils\n"
              "import transformers.integrations.sdpa_attention\n"
              "before = dict(os.environ)\n"
              "import agentrl.attention, agentrl.inference.cpu.kv_cache, agentrl.inference.cpu.memory\n"
              "import agentrl.inference.cpu.packed_linear, agentrl.inference.cpu.speculation, agentrl.inference.cpu.threads\n"
              "print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))")
    clean = {k: v for k, v in os.environ.items() if k not in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", script], env=clean, capture_output=True, text=True, check=True,
                         timeout=300)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
