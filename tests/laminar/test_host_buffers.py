"""The relay's host buffers: a released buffer's pages serve the next push of its size, never
while a view of it lives, and the kernel may take a spare's pages back (MADV_FREE)."""

import gc
import sys
import threading

import pytest
import torch

from agentrl.laminar.host_buffers import MIN_POOLED_BYTES, HostBufferPool
from agentrl.laminar.relay import Relay, RelayChain
from agentrl.laminar.runtime import LocalRuntime

SIZE = 4 * MIN_POOLED_BYTES


def let_go() -> None:
    """Collect, and wait for the released buffers' pages to reach their pool (a thread of theirs)."""
    gc.collect()
    for thread in threading.enumerate():
        if thread.name == "relay-spare":
            thread.join()


def test_a_released_buffer_serves_the_next_take_of_its_size():
    pool = HostBufferPool()
    first = pool.take(SIZE)
    first.fill_(7)
    address = first.data_ptr()
    del first
    let_go()
    assert pool.spare_bytes == SIZE
    again = pool.take(SIZE)
    assert again.data_ptr() == address and pool.stats == {"fresh": 1, "reused": 1}
    assert pool.spare_bytes == 0
    del again
    other = pool.take(SIZE + 4096)  # another size: a fresh mapping, and the spare is unmapped
    assert pool.stats == {"fresh": 2, "reused": 1} and pool.spare_bytes == 0
    del other


def test_a_buffer_with_a_live_view_is_never_handed_out_again():
    pool = HostBufferPool()
    buffer = pool.take(SIZE)
    buffer.fill_(3)
    view = buffer[MIN_POOLED_BYTES:].view(torch.int32)  # an engine's weights: views of the buffer
    del buffer
    let_go()
    assert pool.spare_bytes == 0
    second = pool.take(SIZE)
    second.fill_(9)
    assert second.data_ptr() != view.data_ptr() - MIN_POOLED_BYTES
    assert bool((view == 0x03030303).all())  # the held version is intact
    del view
    let_go()
    assert pool.spare_bytes == SIZE  # the last view went: now its pages are the spare


@pytest.mark.skipif(sys.platform != "linux", reason="smaps_rollup's LazyFree is Linux's")
def test_the_spare_is_lazily_freed_memory():
    def lazy_free_kb() -> int:
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("LazyFree:"))

    pool = HostBufferPool()
    before = lazy_free_kb()
    buffer = pool.take(SIZE)
    buffer.fill_(1)  # faulted in
    del buffer
    let_go()
    assert lazy_free_kb() - before >= 0.9 * SIZE / 1024  # the kernel may keep a few pages aside


async def test_a_relay_writes_each_push_into_the_pages_its_engines_let_go():
    """Engines that copy a version out (a GPU engine) and drop its views: from the third push on,
    each push reuses the buffer two versions back, and every version arrives intact."""
    rt = LocalRuntime()
    relay = rt.spawn(Relay, "m", name="m")
    chain = RelayChain([relay])
    await chain.build()
    for version in range(1, 6):
        weights = {"w": torch.full((SIZE // 4,), float(version))}
        await chain.push(weights, version)
        snapshot = await relay.fetch_latest(version - 1, "local")
        copied = {k: v.clone() for k, v in snapshot.state_dict().items()}  # to "device"
        assert torch.equal(copied["w"], weights["w"])
        del snapshot
        let_go()
    stats = await relay.get_stats()
    assert stats["buffers_allocated"] == 5 and stats["buffers_reused"] >= 3
    await rt.shutdown()
