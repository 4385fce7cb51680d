"""The node pool actor's body without Ray (`OwnedSandboxPool`, real bubblewrap sandboxes): leases
are counted by the process they served, and a dead holder's leases come back."""

from __future__ import annotations

import os
import subprocess

from agentrl.config import SandboxConfig
from agentrl.laminar.cluster import OwnedSandboxPool


async def test_leases_are_counted_per_process_and_a_dead_holders_come_back() -> None:
    pool = OwnedSandboxPool(SandboxConfig(backend="local", pool_size=2), run_id="owned-pool-test", size=2,
                            reap_interval_s=3600)  # reaped by hand below
    await pool.start()
    child = subprocess.Popen(["sleep", "60"])
    try:
        mine = await pool.acquire_for(os.getpid(), timeout=60)
        theirs = await pool.acquire_for(child.pid, timeout=60)
        assert (await pool.exec(mine, ["echo", "ran"])).stdout.strip() == "ran"
        m = pool.metrics()
        assert m["node"] == "local" and m["backend"] == "local" and m["leases"] == 2
        assert m["acquires_by_pid"] == {str(os.getpid()): 1, str(child.pid): 1}
        assert await pool.reap() == 0  # both holders alive
        child.kill()
        child.wait()
        assert await pool.reap() == 1 and theirs not in pool.leases and mine in pool.leases
        await pool.release(mine)
        assert pool.metrics()["leases"] == 0 and pool.metrics()["reclaimed"] == 1
    finally:
        child.kill()
        await pool.close()
