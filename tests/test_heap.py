"""trim_heap (agentrl/heap.py): freed tensors that glibc keeps in its heap go back to the OS."""

from __future__ import annotations

import psutil
import torch

from agentrl.heap import trim_heap


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
