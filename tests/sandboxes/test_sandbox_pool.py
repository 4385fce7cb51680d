"""SandboxPool on real local (bubblewrap) sandboxes, plus dead-container replacement on Docker."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import RUN_ID, config, require_docker

from agentrl.sandboxes import Lease, SandboxError, SandboxPool, SandboxTimeout, make_pool
from agentrl.sandboxes.pool import percentile


async def test_reset_between_users(backend: str) -> None:
    async with make_pool(config(backend), run_id=RUN_ID, name="pytest", size=1) as pool:
        async with pool.acquire(timeout=30) as sb:
            await sb.write_file("secret.txt", "from user 1")
            await sb.exec("mkdir -p deep/dir && echo x > deep/dir/f")
        async with pool.acquire(timeout=30) as sb:
            r = await sb.exec("ls -A /work")
            assert r.stdout == "", "a file written by one user must be gone for the next"


async def test_back_pressure_fifo_and_no_deadlock() -> None:
    pool = make_pool(config("local"), size=2)
    await pool.start()
    in_use, peak, order = 0, 0, []

    async def user(i: int) -> str:
        nonlocal in_use, peak
        async with pool.acquire(timeout=30) as sb:
            order.append(i)
            in_use += 1
            peak = max(peak, in_use)
            r = await sb.exec(f"echo {i}")
            await asyncio.sleep(0.05)
            in_use -= 1
            return r.stdout

    tasks = []
    for i in range(9):  # far more waiters than sandboxes, queued in a known order
        tasks.append(asyncio.create_task(user(i)))
        await asyncio.sleep(0)
    outs = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert outs == [f"{i}\n" for i in range(9)]
    assert peak == 2
    assert order == list(range(9)), "waiters must be served first come, first served"
    m = pool.metrics()
    assert m["acquires"] == 9 and m["execs"] == 9 and m["in_use"] == 0 and m["idle"] == 2
    assert m["acquire_wait_p99_ms"] > m["acquire_wait_p50_ms"] >= 0
    await pool.close()


async def test_acquire_timeout_is_clear_and_harmless() -> None:
    pool = make_pool(config("local"), size=1, name="tiny")
    await pool.start()
    held = await pool.get()
    start = time.monotonic()
    with pytest.raises(SandboxTimeout, match=r"no sandbox free in pool 'tiny' within 0.2 s"):
        await pool.get(timeout=0.2)
    assert 0.15 < time.monotonic() - start < 2
    # a cancelled waiter does not swallow the next free sandbox either
    waiter = asyncio.create_task(pool.get())
    await asyncio.sleep(0.05)
    waiter.cancel()
    await held.close()  # Lease.close() returns it to the pool
    again = await pool.get(timeout=1)
    assert isinstance(again, Lease)
    with pytest.raises(SandboxError, match="already returned"):
        await held.exec("true")
    assert pool.metrics()["acquire_timeouts"] == 1
    await pool.close()
    with pytest.raises(SandboxError, match="closed"):
        await pool.get()


async def test_waiters_fail_cleanly_when_pool_closes() -> None:
    pool = make_pool(config("local"), size=1)
    await pool.start()
    await pool.get()
    waiter = asyncio.create_task(pool.get(timeout=10))
    await asyncio.sleep(0.05)
    await pool.close()
    with pytest.raises(SandboxError, match="closed while waiting"):
        await waiter


async def test_a_sandbox_given_back_while_the_pool_closes_is_closed_before_close_returns() -> None:
    """A lease returned just before close() is still resetting when the pool closes; close() must
    not return before that sandbox is closed (a Ray pool actor is killed right after close(), and
    a Docker container left mid-reset then outlived the run). Logic only: a sandbox whose reset
    is slow; the real Docker path is tests/test_cli_cluster.py's two-worker run."""

    class SlowReset:
        def __init__(self) -> None:
            self.closed = False

        async def reset(self) -> None:
            await asyncio.sleep(0.3)

        async def close(self) -> None:
            self.closed = True

    made: list[SlowReset] = []

    def factory() -> SlowReset:
        made.append(SlowReset())
        return made[-1]

    pool = SandboxPool(factory, size=1, health_interval_s=None)
    await pool.start()
    lease = await pool.get()
    giving_back = asyncio.create_task(pool.put(lease))
    await asyncio.sleep(0.05)  # the put is inside the reset now
    await pool.close()
    assert made[0].closed, "close() returned with a sandbox mid-reset still open"
    await giving_back
    assert len(made) == 1 and pool.metrics()["idle"] == 0


async def test_broken_local_sandbox_is_replaced() -> None:
    pool = make_pool(config("local"), size=1, health_interval_s=None)
    await pool.start()
    lease = await pool.get()
    old = lease.sandbox
    await old.close()  # break it behind the pool's back: its reset fails on release
    await pool.put(lease)
    async with pool.acquire(timeout=10) as sb:
        assert sb.sandbox is not old
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    assert pool.metrics()["replacements"] == 1
    await pool.close()


@pytest.mark.docker
async def test_killed_container_is_replaced_by_health_check() -> None:
    require_docker()
    from agentrl.sandboxes.docker import docker_client

    async with make_pool(config("docker"), run_id=RUN_ID, name="pytest", size=2, health_interval_s=None) as pool:
        victim = pool._idle[0]
        docker_client().containers.get(victim.id).kill()  # from outside, like an OOM killer or an operator
        assert await pool.check_health() == 1
        ids = set()
        for _ in range(2):
            lease = await pool.get(timeout=30)
            ids.add(lease.sandbox.id)
            assert (await lease.exec("echo ok")).stdout == "ok\n"
        assert victim.id not in ids and len(ids) == 2
        m = pool.metrics()
        assert m["replacements"] == 1 and m["startup_p50_ms"] > 0


async def test_failed_start_is_reported() -> None:
    def broken() -> object:
        raise RuntimeError("image exploded")

    pool = SandboxPool(broken, size=2, name="broken")
    with pytest.raises(SandboxError, match=r"pool 'broken': 2 of 2 sandboxes failed to start"):
        await pool.start()
    with pytest.raises(ValueError, match="pool size must be an int >= 1"):
        SandboxPool(broken, size=0)


def test_percentile() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([5.0], 99) == 5.0
    assert percentile([float(i) for i in range(101)], 50) == 50.0
    assert percentile([float(i) for i in range(101)], 99) == 99.0
