"""The cluster-node image builds from the local base image (no registry) and runs `agentrl`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.checkout import copy_checkout
from tests.support.docker import require_docker

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TAG = "agentrl-node:test"


def test_dockerfile_builds_from_base_image_and_runs_help(tmp_path: Path) -> None:
    require_docker()
    ctx = tmp_path / "ctx"
    copy_checkout(ctx, lambda rel: not rel.startswith(("tests/", "bench/", "docs/")))
    (ctx / "wheels").mkdir(exist_ok=True)
    for wheel in Path("/opt/wheels").glob("torch-*.whl"):  # the machine's CPU torch, if it has one
        shutil.copy2(wheel, ctx / "wheels" / wheel.name)
    ca = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
    if ca.is_file():  # this machine may reach PyPI through a TLS-intercepting proxy
        shutil.copy2(ca, ctx / "wheels" / "ca-certificates.crt")
    build = subprocess.run(["docker", "build", "--force-rm", "--network", "host", "--build-arg", "BASE_IMAGE=agentrl-base:bookworm",
                            "-t", TAG, str(ctx)], capture_output=True, text=True, timeout=1800)
    try:
        assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
        run = subprocess.run(["docker", "run", "--rm", "--network", "none", TAG, "--help"],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        for command in ["train", "eval", "sandbox", "report"]:
            assert command in run.stdout
        envs = subprocess.run(["docker", "run", "--rm", "--network", "none", TAG, "envs"],
                              capture_output=True, text=True, timeout=300)
        assert "swe" in envs.stdout, envs.stderr[-2000:]
    finally:
        subprocess.run(["docker", "rmi", "-f", TAG], capture_output=True)
