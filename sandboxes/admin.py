"""Housekeeping: list and prune Docker sandbox containers by label (also those of crashed runs),
prune local-sandbox dirs of dead processes, and build task images from a base image. The CLI wires
these into `agentrl sandbox ls|prune|build`."""

from __future__ import annotations

import io
import os
import shlex
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import SandboxError
from .docker import LABEL_CREATED, LABEL_POOL, LABEL_RUN, LABEL_SANDBOX, docker_client
from .local import TEMP_PREFIX, _force_rmtree


def _filters(run_id: str | None) -> dict[str, list[str]]:
    labels = [LABEL_SANDBOX] + ([f"{LABEL_RUN}={run_id}"] if run_id is not None else [])
    return {"label": labels}


def _describe(container: Any, now: float) -> dict[str, Any]:
    labels = container.labels or {}
    created = int(labels.get(LABEL_CREATED, "0") or 0)
    return {
        "id": container.short_id,
        "name": container.name,
        "image": (container.image.tags or [container.image.short_id])[0] if container.image else "?",
        "status": container.status,
        "run_id": labels.get(LABEL_RUN, ""),
        "pool": labels.get(LABEL_POOL, ""),
        "created": created,
        "age_s": round(now - created, 1) if created else None,
    }


def list_containers(all_runs: bool = True, run_id: str | None = None, client: Any = None) -> list[dict[str, Any]]:
    """Every agentrl sandbox container (running or not), or only those of `run_id`."""
    if not all_runs and run_id is None:
        raise ValueError("list_containers(all_runs=False) needs a run_id")
    client = client or docker_client()
    now = time.time()
    found = client.containers.list(all=True, filters=_filters(None if all_runs and run_id is None else run_id))
    return sorted((_describe(c, now) for c in found), key=lambda d: d["created"])


def prune(run_id: str | None = None, older_than_s: float | None = None, client: Any = None) -> int:
    """Remove (force) agentrl sandbox containers and their /work volumes: all of them, those of one
    run, and/or those older than `older_than_s`. Returns how many were removed."""
    import docker  # optional: the Docker SDK

    if older_than_s is not None and older_than_s < 0:
        raise ValueError(f"older_than_s must be >= 0, got {older_than_s}")
    client = client or docker_client()
    now = time.time()
    removed = 0
    for container in client.containers.list(all=True, filters=_filters(run_id)):
        created = int((container.labels or {}).get(LABEL_CREATED, "0") or 0)
        if older_than_s is not None and now - created < older_than_s:
            continue
        try:
            container.remove(force=True, v=True)
            removed += 1
        except docker.errors.NotFound:  # removed meanwhile by its own pool
            pass
    return removed


def prune_local_dirs(tmp_root: str | None = None) -> int:
    """Remove local-sandbox work dirs whose creating process is gone (a crash skipped close()).
    Returns how many were removed."""
    removed = 0
    for path in Path(tmp_root or tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*"):
        pid = path.name[len(TEMP_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        _force_rmtree(path)
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dockerfile(base: str, packages: Sequence[str] = (), pip: Sequence[str] = (), run: Sequence[str] = ()) -> str:
    """Dockerfile text for a task image: Debian packages, then a venv with pip packages first on PATH."""
    lines = [f"FROM {base}"]
    if packages:
        pkgs = " ".join(shlex.quote(p) for p in packages)
        lines.append("RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
                     f"--no-install-recommends {pkgs} && rm -rf /var/lib/apt/lists/*")
    if pip:
        reqs = " ".join(shlex.quote(p) for p in pip)
        lines += ["RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir " + reqs,
                  "ENV PATH=/opt/venv/bin:$PATH"]
    lines += [f"RUN {cmd}" for cmd in run]
    return "\n".join(lines) + "\n"


def build_image(base: str, tag: str, packages: Sequence[str] = (), pip: Sequence[str] = (),
                run: Sequence[str] = (), client: Any = None) -> str:
    """Build `tag` from `base` (host network for the build only; sandboxes still run with none).
    Returns the image id."""
    import docker  # optional: the Docker SDK

    client = client or docker_client()
    try:
        client.images.get(base)
    except docker.errors.ImageNotFound:
        raise SandboxError(f"base image {base!r} not found; build it with `sudo scripts/docker_up.sh`") from None
    text = dockerfile(base, packages, pip, run)
    try:
        image, _logs = client.images.build(fileobj=io.BytesIO(text.encode()), tag=tag, network_mode="host",
                                           rm=True, forcerm=True, labels={LABEL_SANDBOX: "image"})
    except docker.errors.BuildError as e:
        tail = "".join(str(chunk.get("stream", "")) for chunk in e.build_log)[-2000:]
        raise SandboxError(f"building {tag} failed: {e.msg}\n{tail}") from e
    return image.id
