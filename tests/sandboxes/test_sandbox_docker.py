"""Docker-backend specifics on the real engine: container settings, labels, admin ls/prune, images."""

from __future__ import annotations

import time
import uuid

import pytest
from conftest import RUN_ID, TEST_LIMITS, config, require_docker

from agentrl.config import SandboxConfig
from agentrl.sandboxes import SandboxError, make_sandbox
from agentrl.sandboxes.common import Limits

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def _engine() -> None:
    require_docker()


async def test_container_settings_and_labels() -> None:
    from agentrl.sandboxes.docker import docker_client

    sb = make_sandbox(config("docker", cpus=0.5), run_id=RUN_ID, pool="pytest")
    try:
        before = time.time()
        await sb.start()  # type: ignore[attr-defined]
        attrs = docker_client().containers.get(sb.id).attrs  # type: ignore[attr-defined]
        host = attrs["HostConfig"]
        assert host["NetworkMode"] == "none"
        # the memory cgroup also holds /work's tmpfs pages, so it is memory_mb + disk_mb
        assert host["Memory"] == host["MemorySwap"] == (TEST_LIMITS["memory_mb"] + SandboxConfig.disk_mb) * 2**20
        assert host["NanoCpus"] == 500_000_000
        assert host["PidsLimit"] == TEST_LIMITS["pids"]
        assert host["ReadonlyRootfs"] is True
        labels = attrs["Config"]["Labels"]
        assert labels["agentrl.run_id"] == RUN_ID and labels["agentrl.pool"] == "pytest"
        assert before - 2 <= int(labels["agentrl.created"]) <= time.time() + 2
        r = await sb.exec("cat /sys/class/net/*/operstate 2>/dev/null; ls /sys/class/net")
        assert r.stdout.split() == ["unknown", "lo"]  # loopback only
    finally:
        await sb.close()


async def test_writable_rootfs_resets_by_recreating() -> None:
    from agentrl.sandboxes.docker import DockerSandbox

    sb = DockerSandbox(SandboxConfig.image, Limits(**TEST_LIMITS), run_id=RUN_ID, pool="pytest", read_only=False)
    try:
        await sb.exec("echo dirty > /opt/state")
        first = sb.id
        await sb.reset()
        assert sb.id != first
        r = await sb.exec("cat /opt/state")
        assert r.exit_code != 0
    finally:
        await sb.close()


async def test_missing_image_is_a_clear_error() -> None:
    sb = make_sandbox(SandboxConfig(backend="docker", image="agentrl-no-such-image:0"), run_id=RUN_ID)
    with pytest.raises(SandboxError, match=r"docker image 'agentrl-no-such-image:0' not found.*docker_up.sh"):
        await sb.exec("true")
    await sb.close()


async def test_list_and_prune_by_label() -> None:
    from agentrl.sandboxes.admin import list_containers, prune

    crashed = f"pytest-crashed-{uuid.uuid4().hex[:6]}"
    leaked = [make_sandbox(config("docker"), run_id=crashed, pool="p") for _ in range(2)]
    for sb in leaked:
        await sb.start()  # type: ignore[attr-defined]
    # simulate a crashed run: its sandboxes are never closed; only the labels remain to find them
    listed = list_containers(run_id=crashed)
    assert {c["id"] for c in listed} == {sb.id[:12] for sb in leaked}  # type: ignore[attr-defined]
    assert all(c["run_id"] == crashed and c["pool"] == "p" and c["status"] == "running" for c in listed)
    assert any(c["run_id"] == crashed for c in list_containers())
    assert prune(run_id=crashed, older_than_s=3600) == 0  # too young
    assert prune(run_id=crashed) == 2
    assert list_containers(run_id=crashed) == []
    with pytest.raises(ValueError, match="needs a run_id"):
        list_containers(all_runs=False)
    for sb in leaked:
        await sb.close()  # already gone: closing is still fine


async def test_build_image_from_base() -> None:
    from agentrl.sandboxes.admin import build_image, dockerfile
    from agentrl.sandboxes.docker import docker_client

    assert "pip install --no-cache-dir pytest" in dockerfile("b", pip=["pytest"])
    tag = f"agentrl-test-{uuid.uuid4().hex[:6]}:latest"
    build_image(SandboxConfig.image, tag, run=["echo built > /marker"])
    try:
        sb = make_sandbox(SandboxConfig(backend="docker", image=tag), run_id=RUN_ID)
        try:
            assert (await sb.exec("cat /marker")).stdout == "built\n"
        finally:
            await sb.close()
    finally:
        docker_client().images.remove(tag, force=True)


async def test_container_killed_from_outside_is_a_clear_error() -> None:
    from agentrl.sandboxes.docker import docker_client

    sb = make_sandbox(config("docker"), run_id=RUN_ID, pool="pytest")
    try:
        await sb.start()  # type: ignore[attr-defined]
        assert await sb.healthy()  # type: ignore[attr-defined]
        docker_client().containers.get(sb.id).kill()  # type: ignore[attr-defined]
        assert not await sb.healthy()  # type: ignore[attr-defined]
        with pytest.raises(SandboxError, match=r"exec in DockerSandbox.* failed"):
            await sb.exec("true")
    finally:
        await sb.close()
