"""threads.py against torch's real libgomp: a thread's OpenMP workers exit when it gives them back."""

from __future__ import annotations

import asyncio
import os
import threading

import torch

from agentrl.inference.cpu.threads import (
    release_idle_workers,
    threads_per_block,
    to_thread_releasing,
    torch_threads,
)


def _process_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _parallel_work() -> int:
    """A matmul big enough to run as a 2-thread OpenMP region; returns the threads alive after it."""
    with torch_threads(2):
        x = torch.randn(512, 512)
        (x @ x).sum().item()
    return _process_threads()


def test_release_idle_workers_lets_the_calling_threads_pool_exit() -> None:
    counts: dict[str, int] = {}

    def worker() -> None:
        counts["before"] = _process_threads()
        counts["with_pool"] = _parallel_work()  # this thread now owns a pool with one worker
        counts["released"] = int(release_idle_workers())
        counts["after"] = _process_threads()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert counts["released"] == 1  # torch's libgomp was found (CI runs Linux with torch's OpenMP)
    assert counts["with_pool"] - counts["after"] == 1  # the pool's one worker (2 threads: this one and it) exited


def test_to_thread_releasing_leaves_no_pool_behind_in_the_executor() -> None:
    def counted_work() -> tuple[int, int]:
        # Counted on the executor's thread right around the work: a thread an earlier test left
        # winding down may exit at any time, so the window stays as short as the work itself.
        return _process_threads(), _parallel_work()

    async def run() -> tuple[int, int]:
        await asyncio.to_thread(lambda: None)  # the default executor's thread exists before we count
        return await to_thread_releasing(counted_work)

    before, during = asyncio.run(run())
    assert during > before  # the pool's worker ran ...
    assert _process_threads() < during  # ... and exited with the task


class _Recorded(torch.autograd.Function):
    """Identity that records the calling thread's intra-op count in its forward and backward."""

    @staticmethod
    def forward(ctx, x, log):
        ctx.log = log
        log.append(("forward", torch.get_num_threads()))
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append(("backward", torch.get_num_threads()))
        return grad, None


class _Block(torch.nn.Module):
    def __init__(self, log: list) -> None:
        super().__init__()
        self.linear, self.log = torch.nn.Linear(4, 4), log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(_Recorded.apply(x, self.log))


def test_threads_per_block_rereads_the_count_before_each_blocks_forward_and_backward() -> None:
    log: list[tuple[str, int]] = []
    model = torch.nn.Sequential(torch.nn.ModuleList([_Block(log) for _ in range(3)]))
    counts = iter([1, 2, 1, 2, 2, 1])  # three forwards, then the backward (last block first)
    with torch_threads(1), threads_per_block(model, lambda: next(counts)):
        x = torch.randn(2, 4, requires_grad=True)
        for block in model[0]:
            x = block(x)
        x.sum().backward()
        after = torch.get_num_threads()
    assert log == [("forward", 1), ("forward", 2), ("forward", 1),
                   ("backward", 2), ("backward", 2), ("backward", 1)]
    assert after == 1 and not model[0][0]._forward_pre_hooks  # the hooks are gone after the block
