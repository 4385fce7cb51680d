"""Whether the Docker tests can run: skip without an engine, fail in CI where one must run."""

from __future__ import annotations

import functools
import os

import pytest

from agentrl.config import SandboxConfig


@functools.cache
def docker_skip_reason() -> str | None:
    """Why docker tests cannot run here, or None when an engine answers and the base image exists."""
    try:
        import docker
    except ImportError:
        return "docker SDK not installed (pip install 'agentrl[docker]')"
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as e:
        return f"no Docker engine answers ({e.__class__.__name__}); run `sudo scripts/docker_up.sh`"
    try:
        client.images.get(SandboxConfig.image)
    except Exception:
        return f"base image {SandboxConfig.image} missing; run `sudo scripts/docker_up.sh`"
    return None


def require_docker() -> None:
    """Skip without an engine — but fail when AGENTRL_REQUIRE_DOCKER=1 (CI), where one must run."""
    reason = docker_skip_reason()
    if reason:
        if os.environ.get("AGENTRL_REQUIRE_DOCKER") == "1":
            pytest.fail(f"AGENTRL_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)
