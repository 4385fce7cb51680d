"""The docker image of a synthesised task: the base image plus pytest and the package's test
requirements (the exact pins of its local task runtime, so both backends run the same versions).
Built once per package, from the task's shipped source archive when this engine lacks it."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .runtime import frozen_requirements, task_runtime
from .schema import resolve_source
from .source import Layout, analyse_repo, parse_spec, unpack


def image_tag(spec: str) -> str:
    name, version = parse_spec(spec)
    return f"agentrl-swe-{re.sub(r'[^a-z0-9]+', '-', name.lower())}:{re.sub(r'[^A-Za-z0-9_.-]', '_', version)}"


HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def dockerfile(base_image: str, requirements: list[str], with_ca: bool) -> str:
    """pytest and the test requirements in the system Python's site-packages (sandboxes run
    `python3` from the default PATH), installed with a throwaway venv's pip. The host's CA bundle is
    used for the build only (machines behind a TLS-intercepting proxy) and not left in the image."""
    reqs = " ".join(f"'{r}'" for r in ["pytest", *requirements])
    # PIP_CERT as well as --cert: pip's build-isolation subprocess (an sdist-only requirement's
    # setuptools) reads the environment, not the parent's command line
    cert = "--cert /tmp/host-ca.crt " if with_ca else ""
    env = "PIP_CERT=/tmp/host-ca.crt " if with_ca else ""
    site = "$(python3 -c 'import site; print(site.getsitepackages()[0])')"
    return (f"FROM {base_image}\n"
            + ("COPY host-ca.crt /tmp/host-ca.crt\n" if with_ca else "")
            + f"RUN python3 -m venv /tmp/pipenv && {env}/tmp/pipenv/bin/pip install {cert}--no-cache-dir "
            f"--disable-pip-version-check --target \"{site}\" {reqs} && rm -rf /tmp/pipenv /tmp/host-ca.crt\n"
            "WORKDIR /work\n")


def build_image(spec: str, layout: Layout, base_image: str, *, rebuild: bool = False,
                requirements: list[str] | None = None) -> str:
    """Build (once) the package's sandbox image: the base image plus pytest and its test deps
    (`requirements`: the exact pins of the package's local task runtime, so both backends run the
    same versions; else the declared test requirements). Builds use the host network; the
    sandboxes themselves run with `--network none`."""
    tag = image_tag(spec)
    if shutil.which("docker") is None:
        raise RuntimeError("the docker CLI is not installed; use sandbox.backend=local or install docker.io")
    if not rebuild and subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory() as ctx:
        with_ca = HOST_CA.exists()
        if with_ca:
            shutil.copy(HOST_CA, Path(ctx, "host-ca.crt"))
        reqs = layout.test_requirements if requirements is None else [r for r in requirements if r != "pytest"]
        Path(ctx, "Dockerfile").write_text(dockerfile(base_image, reqs, with_ca))
        r = subprocess.run(["docker", "build", "--network", "host", "-t", tag, ctx],
                           capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        raise RuntimeError(f"docker build of {tag} failed: {(r.stderr or r.stdout)[-1500:]}")
    return tag


def ensure_task_image(task: dict[str, Any], base_image: str) -> str:
    """The task's docker image, built from its shipped source archive if this engine lacks it."""
    image = task.get("image") or base_image
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0:
        return image
    spec = task.get("environment_setup", {}).get("package")
    if not spec or image != image_tag(spec):
        raise RuntimeError(f"task {task['instance_id']}: docker image {image} is missing and agentrl does not "
                           "know how to build it (no environment_setup.package)")
    archive = resolve_source(task)
    if archive is None:
        raise RuntimeError(f"task {task['instance_id']}: image {image} is missing and the task has no source")
    with tempfile.TemporaryDirectory() as tmp:
        layout = analyse_repo(unpack(archive, Path(tmp)))
    return build_image(spec, layout, base_image, requirements=frozen_requirements(task_runtime(task)))
