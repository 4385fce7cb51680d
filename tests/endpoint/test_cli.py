"""Through the user's door: `agentrl train --env module:AgentClass` for a plain tool-calling loop and
for the OpenAI Agents SDK's agent, and `agentrl serve` answered by the openai SDK (issue 54)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from .programs import ADD_TOOLS

pytestmark = pytest.mark.slow

PROGRAMS = Path(__file__).resolve().parent / "programs.py"
TINY = ["trainer.batch_groups=1", "rollout.group_size=2", "rollout.concurrency=2", "sampling.max_tokens=16",
        "trainer.micro_batch_size=2", "trainer.warm_start.enabled=false", "eval.enabled=false", "--quiet"]


def agentrl(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (the model trains); a loaded one takes several times that
@pytest.mark.parametrize("program", ["ToolLoopAgent", "AgentsSDKAgent"])
def test_an_agent_program_trains_two_steps(tmp_path: Path, program: str) -> None:
    out = agentrl("train", "--env", f"{PROGRAMS}:{program}", "trainer.steps=2", "trainer.checkpoint_every=1",
                  f"run.dir={tmp_path}",
                  "run.name=agent", *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "agent" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r["policy_tokens"] > 0 and r["stepwise_fraction"] == 0.0 and r["agent_dropped"] == 0 for r in rows)
    trajs = [json.loads(line) for line in (tmp_path / "agent" / "trajectories.jsonl").read_text().splitlines()]
    # (a loaded machine may run an episode past rollout.trajectory_timeout_s: aborted, not an error)
    assert trajs and {t["mode"] for t in trajs} == {"append"} and "finished" in {t["status"] for t in trajs}
    assert {t["status"] for t in trajs} <= {"finished", "aborted"}, [t["error"] for t in trajs]
    # every policy token of a trajectory came from one weight version (Trajectory.version raises otherwise)
    assert all(isinstance(t["version"], int) and t["staleness"] is not None for t in trajs)
    if program == "ToolLoopAgent":  # the trained checkpoint, served for the user's own harness
        with serving(str(tmp_path / "agent")) as (client, _):
            reply = client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "1 + 2?"}],
                                                   tools=ADD_TOOLS)
            assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_env_check_runs_the_program_with_the_caller_as_the_policy() -> None:
    out = agentrl("env", "check", f"{PROGRAMS}:ToolLoopAgent")
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "OK:" in out.stdout and "malformed actions each gave an observation" in out.stdout


@contextlib.contextmanager
def serving(target: str) -> Iterator[tuple[openai.OpenAI, int]]:
    """`agentrl serve TARGET --port 0` in a subprocess: an openai client on it and its port; stopped
    with Ctrl-C (SIGINT) at the end, which must exit 0 and leave nothing listening."""
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve", target, "sampling.max_tokens=8", "--port",
                             "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:(\d+)/v1) \(loopback only", line)
        assert found, f"serve printed {line!r}" + (f", then exited: {proc.stderr.read()[-2000:]}" if not line else "")
        port = int(found.group(2))
        client = openai.OpenAI(base_url=found.group(1), api_key="any key: serve mode records nothing", max_retries=0)
        yield client, port
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "stopped" in out
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_serve_answers_the_openai_sdk_on_loopback_and_stops_on_ctrl_c() -> None:
    with serving("smollm2-135m") as (client, _):
        reply = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Hi!"}],
                                               max_tokens=4, logprobs=True, seed=3)
        again = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Hi!"}],
                                               max_tokens=4, logprobs=True, seed=3)
        assert reply.choices[0].message.content == again.choices[0].message.content  # a seed is honoured
        assert 1 <= reply.usage.completion_tokens <= 4 and len(reply.choices[0].logprobs.content) >= 1
        assert [m.id for m in client.models.list().data] == ["smollm2-135m"]
        with pytest.raises(openai.BadRequestError, match="'n' must be at most 16"):
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], n=100)
