"""Issue 57: a Docker engine that stops answering once `agentrl train` is under way ends the run
with one line and a non-zero exit, within a bounded time, not a hang; the containers it leaves (the
wedged engine cannot remove them) go with the command that line names, `agentrl sandbox prune`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.docker import require_docker
from tests.support.engine_proxy import FreezableProxy, freezable_engine

pytestmark = [pytest.mark.slow, pytest.mark.docker]

TINY = ["trainer.batch_groups=1", "rollout.group_size=2", "rollout.concurrency=2", "sampling.max_tokens=24",
        "env.max_turns=2", "trainer.micro_batch_size=2", "sandbox.pool_size=2", "trainer.checkpoint_every=1000",
        "trainer.warm_start.enabled=false", "eval.enabled=false", "--quiet"]


def test_an_engine_that_stops_answering_ends_train_with_one_line(tmp_path: Path) -> None:
    require_docker()
    import docker  # the docker extra, present when require_docker passed

    run_name = f"pytest-engine-gone-{os.getpid()}"
    client = docker.from_env(timeout=30)
    try:
        with freezable_engine(str(tmp_path / "docker.sock")) as engine:
            stdout, stderr, returncode, took_s = _train_then_freeze(engine, tmp_path, run_name, client)
        # besides the model loader's progress bars, one line: the error
        lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("Loading weights")]
        assert returncode == 1 and "Traceback" not in stderr, (returncode, stderr[-3000:])
        assert len(lines) == 1 and lines[0].startswith("agentrl train: the sandboxes stopped working"), (stdout, stderr)
        assert "the sandbox backend stopped answering" in lines[0] and "agentrl sandbox prune" in lines[0], lines
        # detection (3 missed pings, ~40 s), a reset's 30 s, SDK calls bounded by ENGINE_TIMEOUT_S (30 s): ~110 s here
        assert took_s < 200, took_s
    finally:  # what the line says to do, through the engine that answers again
        pruned = subprocess.run([sys.executable, "-m", "agentrl.cli", "sandbox", "prune", "--run-id", run_name],
                                capture_output=True, text=True, timeout=120)
        left = client.api.containers(all=True, filters={"label": f"agentrl.run_id={run_name}"})
        client.close()
    assert pruned.returncode == 0 and left == [], (pruned.stderr[-2000:], left)


def _train_then_freeze(engine: FreezableProxy, tmp_path: Path, run_name: str, client: Any) -> tuple[str, str, int, float]:
    """`agentrl train` on Docker through the proxy, frozen once the run's sandboxes are up; its
    stdout, stderr, exit code and the seconds it took to end after the freeze."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path / 'docker.sock'}"}
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "train", "--env", "code", "trainer.steps=500",
                             "sandbox.backend=docker", f"run.dir={tmp_path}", f"run.name={run_name}", *TINY],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not client.api.containers(filters={"label": f"agentrl.run_id={run_name}"}):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(1)
        time.sleep(10)  # the run is under way (the engine starts, episodes begin); a step can take minutes here
        assert proc.poll() is None, proc.communicate()
        engine.frozen.set()
        frozen_at = time.monotonic()
        stdout, stderr = proc.communicate(timeout=240)
        return stdout, stderr, proc.returncode, time.monotonic() - frozen_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
