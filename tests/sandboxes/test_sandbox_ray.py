"""The Ray pool actor on a real local Ray cluster (ray.init(num_cpus=2)), with local sandboxes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import config

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


async def test_pool_actor_per_node_exec_by_lease(ray_cluster: None, tmp_path: Path) -> None:
    from agentrl.sandboxes import SandboxTimeout
    from agentrl.sandboxes.ray_pool import ACTOR_PREFIX, acquire, start_node_pools

    pools = start_node_pools(config("local"), size=2)
    (node, actor), = pools.items()
    assert ray.get_actor(f"{ACTOR_PREFIX}-{node}") is not None
    try:
        a, b = await acquire(actor, timeout=30), await acquire(actor, timeout=30)
        await a.write_file("note.txt", "from a")
        r = await a.exec("cat note.txt; echo $X", env={"X": "1"})
        assert r.stdout == "from a1\n" and r.ok
        assert (await b.exec("ls -A")).stdout == ""  # leases are distinct sandboxes
        with pytest.raises(SandboxTimeout, match="no sandbox free"):
            await acquire(actor, timeout=0.2)
        # upload / download cross the actor boundary as tar bytes
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "f.py").write_text("print(6 * 7)\n")
        await a.upload(str(tmp_path / "d"), "proj")
        assert (await a.exec("python3 proj/f.py")).stdout == "42\n"
        await a.download("proj/f.py", str(tmp_path / "back.py"))
        assert (tmp_path / "back.py").read_text() == "print(6 * 7)\n"
        await a.close()
        await b.close()
        # a released sandbox comes back clean, and concurrent leases queue for the two sandboxes
        async def job(i: int) -> str:
            sb = await acquire(actor, timeout=30)
            try:
                return (await sb.exec(f"ls -A; echo {i}")).stdout
            finally:
                await sb.close()

        outs = await asyncio.gather(*(job(i) for i in range(6)))
        assert outs == [f"{i}\n" for i in range(6)]
        m = await actor.metrics.remote()
        assert m["leases"] == 0 and m["size"] == 2 and m["execs"] >= 9
    finally:
        await actor.close.remote()
        ray.kill(actor)


def test_actor_body_rejects_unknown_lease() -> None:
    from agentrl.sandboxes import SandboxError
    from agentrl.sandboxes.ray_pool import SandboxPoolActor

    body = SandboxPoolActor(config("local"), size=1)
    with pytest.raises(SandboxError, match="unknown or released sandbox lease 'nope'"):
        body._lease("nope")
