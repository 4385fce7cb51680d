"""Shared fixtures for the sandbox tests: backends, and a session-wide check that nothing leaks
(temp dirs, containers with this session's label, processes carrying this session's markers)."""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentrl.config import SandboxConfig
from agentrl.sandboxes import Sandbox, make_sandbox
from tests.support.docker import docker_skip_reason, require_docker

RUN_ID = f"pytest-{os.getpid()}-{uuid.uuid4().hex[:6]}"  # label of every container this session starts
MARK = f"{1000 + (os.getpid() % 997) / 1000:.3f}"  # `sleep 1000.xyz`: unique to this session
TEST_LIMITS = {"memory_mb": 256, "pids": 64, "timeout_s": 10.0, "max_output_bytes": 100_000}


def host_processes(needle: str) -> list[tuple[int, str]]:
    """(pid, cmdline) of every host process whose command line contains `needle`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        cmd = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        if needle in cmd and "pytest" not in cmd:
            found.append((int(entry), cmd))
    return found


def config(backend: str, **overrides: object) -> SandboxConfig:
    return SandboxConfig(backend=backend, **{**TEST_LIMITS, **overrides})  # type: ignore[arg-type]


@pytest.fixture(scope="session", autouse=True)
def no_leftovers() -> Iterator[None]:
    """Every sandbox temp dir of this session lives under one root dir; all must be gone at the end,
    as must this session's containers and marked processes."""
    # made here, not at import: a run that selects no sandbox test must not leave an empty dir
    root = Path(tempfile.mkdtemp(prefix="agentrl-test-sbx-root-"))
    root.chmod(0o711)  # bwrap runs as uid 65534 when we are root and must reach the work dirs
    # multiprocessing makes its temp dir lazily under tempfile.tempdir and removes it at exit:
    # make it now, outside the root we remove below, so its exit-time cleanup finds it
    multiprocessing.util.get_temp_dir()
    old = tempfile.tempdir
    tempfile.tempdir = str(root)
    yield
    tempfile.tempdir = old
    leftovers = [p.name for p in root.iterdir() if p.name.startswith("agentrl-sbx-")]
    shutil.rmtree(root, ignore_errors=True)
    stray = host_processes(f"sleep {MARK}")
    containers = []
    if docker_skip_reason() is None:
        from agentrl.sandboxes.admin import list_containers

        containers = list_containers(run_id=RUN_ID)
    assert not leftovers, f"sandbox temp dirs left behind: {leftovers}"
    assert not stray, f"stray processes left behind: {stray}"
    assert not containers, f"containers left behind: {containers}"


BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "docker":
        require_docker()
    return request.param


@pytest.fixture
async def sandbox(backend: str) -> AsyncIterator[Sandbox]:
    sb = make_sandbox(config(backend), run_id=RUN_ID, pool="pytest")
    await sb.start()  # type: ignore[attr-defined]
    try:
        yield sb
    finally:
        await sb.close()
