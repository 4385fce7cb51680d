"""Issue 57: a sandbox fault is recorded where a user reads the run -- the turn's record, the
trajectory's metrics (`sandbox_fault_<kind>`), its trajectories.jsonl line and metrics.jsonl's
`sandbox_faults` by kind -- through the real rollout engine, a real env and real bubblewrap (only
the policy is scripted, so that it makes exactly these tool calls)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from conftest import RUN_ID, config

from agentrl.inference.base import GenerateOutput, SamplingParams
from agentrl.parsing import ToolCall
from agentrl.rollout.engine import RolloutEngine
from agentrl.run import readable_trajectory, step_metrics
from agentrl.sandboxes import make_pool
from agentrl.sandboxes.common import FAULT_DEAD, FAULT_DISK_FULL, FAULT_KINDS
from agentrl.types import Status
from envs.code import CodeEnv
from tests.rollout.fakes import CharTokenizer, ScriptedEngine

FILL = "f = open('/work/fill', 'wb')\nwhile True: f.write(b'x' * 2**20); f.flush()\n"


class _KillsTheSandboxBeforeTurn2(ScriptedEngine):
    """The policy's second reply comes after the env's sandbox was killed from the host."""

    def __init__(self, tokenizer: Any, envs: list[CodeEnv], reply: Any) -> None:
        super().__init__(tokenizer, reply)
        self.envs = envs

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput:
        if len(self.calls) == 1:
            await self.envs[0].sandbox.sandbox.kill()
            await asyncio.sleep(0.2)  # the channel notices its agent is gone
        return await super().generate(prompt_ids, sampling)


async def test_disk_full_and_a_dead_sandbox_reach_the_trajectory_record_and_the_metrics_line() -> None:
    pool = make_pool(config("local", disk_mb=16), run_id=RUN_ID, name="pytest", size=1, health_interval_s=None)
    envs: list[CodeEnv] = []

    def factory() -> CodeEnv:
        envs.append(CodeEnv(num_tasks=1, sandbox_pool=pool, tool_timeout_s=30, max_turns=4))
        return envs[-1]

    def reply(prompt: str, n: int, seed: int | None) -> str:
        code = FILL if n == 0 else "print(1)"
        return envs[0].tool_parser.format_call(ToolCall("python", {"code": code}))

    tokenizer = CharTokenizer()
    rollout = RolloutEngine(_KillsTheSandboxBeforeTurn2(tokenizer, envs, reply), tokenizer,
                            SamplingParams(seed=1, max_tokens=4000), max_context_tokens=100_000)
    try:
        group = await rollout.run_group(factory, CodeEnv(num_tasks=1).tasks()[0], 1, group_id="faults")
    finally:
        await pool.close()
    (traj,) = group.trajectories
    # the dead sandbox ended the episode in error with its reason; the full disk was an observation
    assert traj.status is Status.ERROR and traj.error.startswith("SandboxDead: sandbox_dead: "), traj.error
    (turn1, turn2) = traj.segments[0].turns
    assert turn1.sandbox_faults == [FAULT_DISK_FULL] and turn2.sandbox_faults == [], (turn1, turn2)
    assert "sandbox fault (disk_full)" in turn1.observation[0]["content"], turn1.observation
    assert traj.to_dict()["segments"][0]["turns"][0]["sandbox_faults"] == [FAULT_DISK_FULL]
    assert traj.metrics["sandbox_fault_disk_full"] == 1 and traj.metrics["sandbox_fault_sandbox_dead"] == 1

    record = json.loads(readable_trajectory(traj, step=0))  # a trajectories.jsonl line
    assert record["sandbox_faults"] == {FAULT_DISK_FULL: 1, FAULT_DEAD: 1}, record
    assert record["status"] == "error" and record["error"].startswith("SandboxDead"), record

    line = step_metrics({"step": 0, "version": 0, "backend": "global-async"}, [group], {})  # a metrics.jsonl line
    assert line["sandbox_faults"] == {**dict.fromkeys(FAULT_KINDS, 0), FAULT_DISK_FULL: 1, FAULT_DEAD: 1}, line
    assert line["status"] == {"error": 1}, line
