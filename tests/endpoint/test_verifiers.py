"""`--env verifiers:MODULE`: a verifiers v1 environment written with its public API (inline tasks,
its own harness, no hub, no network) is checked and trained through the policy endpoint by the
real verifiers package (its loader, interception server and rubric), issue 54."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("verifiers", reason="the verifiers extra is not installed: pip install 'agentrl[verifiers]'")

HERE = Path(__file__).resolve().parent  # vf_addition.py, importable by name as verifiers loads it


def agentrl(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def test_env_check_passes_on_a_verifiers_environment(tmp_path: Path) -> None:
    out = agentrl("env", "check", "verifiers:vf_addition", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "OK:" in out.stdout and "FAIL" not in out.stdout


@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (the model trains); a loaded one takes several times that
def test_a_verifiers_environment_trains_two_steps_with_its_rubric_as_reward(tmp_path: Path) -> None:
    out = agentrl("train", "--env", "verifiers:vf_addition", "trainer.steps=2", f"run.dir={tmp_path}", "run.name=vf",
                  "trainer.batch_groups=1", "rollout.group_size=2", "rollout.concurrency=2", "sampling.max_tokens=8",
                  "trainer.micro_batch_size=2", "trainer.warm_start.enabled=false", "eval.enabled=false", "--quiet",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "vf" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and all(r["policy_tokens"] > 0 for r in rows)
    trajs = [json.loads(line) for line in (tmp_path / "vf" / "trajectories.jsonl").read_text().splitlines()]
    assert trajs and all(t["status"] == "finished" and t["mode"] == "append" for t in trajs)
    for t in trajs:  # the rubric's reward: 1 when the reply holds the sum
        prompt = next(m["content"] for m in t["messages"] if m["role"] == "user")
        a, b = (int(x) for x in prompt.removeprefix("What is ").removesuffix("?").split(" + "))
        assert t["reward"] == float(str(a + b) in t["messages"][-1]["content"])


def test_a_module_that_is_no_verifiers_taskset_is_one_clear_line(tmp_path: Path) -> None:
    out = agentrl("train", "--env", "verifiers:no_such_vf_module", "trainer.steps=1", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "verifiers:no_such_vf_module is not a verifiers taskset" in out.stderr
