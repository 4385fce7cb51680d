"""bench/soak.py through its command line (issue 57): every episode accounted for, every injected
fault reported as its own kind, nothing left behind, on bubblewrap and on Docker; and a Docker
engine that stops answering mid-run ends it with one line, not a hang."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.sandboxes.common import FAULT_KINDS
from tests.support.docker import require_docker
from tests.support.engine_proxy import FreezableProxy, freezable_engine

ROOT = Path(__file__).resolve().parent.parent


def soak(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> tuple[int, list[dict]]:
    out = subprocess.run([sys.executable, "bench/soak.py", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout, env=env)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, out.stderr[-2000:]
    return out.returncode, lines


def check_accounting(line: dict) -> None:
    assert line["episodes"] == 12 and line["episodes_lost"] == 0, line
    # each fault kind injected once, and reported as itself; the flood is cut off, not a fault
    assert line["faults_injected"] == {k: 1 for k in (*FAULT_KINDS, "flood")}, line
    assert line["errors_by_reason"] == dict.fromkeys(sorted(FAULT_KINDS), 1), line
    assert line["episodes_ok"] == 12 - len(FAULT_KINDS) and line["fault_mismatches"] == 0, line
    assert line["leaked_total"] == 0 and set(line["leaked"]) == {"containers", "processes", "mounts", "work_dirs"}
    assert line["pool"]["replacements"] >= 1 and line["pool"]["faults"]["sandbox_dead"] == 1, line  # the killed one
    assert line["healthy_throughput_ratio"] > 0 and line["baseline_errors"] == 0, line
    assert len(line["machine"]["load_avg"]) == 3


def test_quick_soak_on_bubblewrap_accounts_for_every_episode() -> None:
    rc, lines = soak("--quick", "--backend", "local")
    assert rc == 0 and [ln["backend"] for ln in lines] == ["local"], lines
    check_accounting(lines[0])


@pytest.mark.docker
def test_quick_soak_on_docker_accounts_for_every_episode() -> None:
    require_docker()
    rc, lines = soak("--quick", "--backend", "docker")
    assert rc == 0 and [ln["backend"] for ln in lines] == ["docker"], lines
    check_accounting(lines[0])


@pytest.fixture
def engine_proxy(tmp_path: Path) -> Iterator[FreezableProxy]:
    with freezable_engine(str(tmp_path / "docker.sock")) as proxy:
        yield proxy


@pytest.mark.docker
def test_an_engine_that_stops_answering_ends_the_soak_with_one_line(engine_proxy: FreezableProxy,
                                                                     tmp_path: Path) -> None:
    require_docker()
    import docker  # the docker extra, present when require_docker passed

    run_id = f"pytest-soak-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path / 'docker.sock'}"}
    proc = subprocess.Popen([sys.executable, "bench/soak.py", "--backend", "docker", "--concurrency", "2",
                             "--episodes", "500", "--baseline-episodes", "500", "--run-id", run_id], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = docker.from_env(timeout=30)
    try:
        deadline = time.monotonic() + 120
        while not client.api.containers(filters={"label": f"agentrl.run_id={run_id}"}):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.5)
        time.sleep(2)  # episodes under way
        engine_proxy.frozen.set()
        frozen_at = time.monotonic()
        stdout, stderr = proc.communicate(timeout=120)
        lines = [line for line in stdout.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, stdout, stderr[-2000:])
        line = json.loads(lines[0])
        assert line["backend"] == "docker" and "the Docker engine stopped answering" in line["error"], line
        assert time.monotonic() - frozen_at < 60
    finally:
        with contextlib.suppress(Exception):
            proc.kill()
            proc.wait(timeout=10)
        for c in client.containers.list(all=True, filters={"label": f"agentrl.run_id={run_id}"}):
            c.remove(force=True, v=True)
        client.close()
