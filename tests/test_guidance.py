"""Demonstration guidance (`trainer.demo_guidance`, agentrl/guidance.py): a group the policy did
not solve gains the env's demonstration of its task, played through the real env and rollout
engine; a broken demonstration leaves the group alone; `agentrl train` trains on a guided group
that would otherwise teach nothing; an env without demonstrations stops before any work."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

import agentrl
from agentrl.config import ConfigError
from agentrl.guidance import DemoGuide
from agentrl.metrics import is_success
from agentrl.models import load_tokenizer, resolve_model
from agentrl.plan import prepare_run
from agentrl.types import Group, Segment, Status, Trajectory


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model("smollm2-135m"))


def sampled(task_id: str, n: int, reward: float, version: int = 3) -> list[Trajectory]:
    """`n` policy trajectories of a task with the given outcome, sampled by weights `version`."""
    out = []
    for i in range(n):
        seg = Segment(prompt_len=2)
        seg.append([1, 2], policy=False)
        seg.append([3, 4], policy=True, logprobs=[-1.0, -1.0], version=version)
        out.append(Trajectory(id=f"{task_id}/{i}", group_id=task_id, task_id=task_id, segments=[seg],
                              outcome_reward=reward, reward=reward, status=Status.FINISHED))
    return out


def guide_for(factory, tasks, tok) -> DemoGuide:
    return DemoGuide(factory, tasks, tok, max_tokens=4096, max_context_tokens=4096, timeout_s=120)


def test_an_unsolved_group_gains_a_played_demonstration_and_a_solved_one_does_not(tok) -> None:
    tasks = list(agentrl.make("search").tasks("train"))[:2]
    unsolved = Group(id=str(tasks[0]["id"]), task_id=str(tasks[0]["id"]),
                     trajectories=sampled(str(tasks[0]["id"]), 2, 0.0))
    solved = Group(id=str(tasks[1]["id"]), task_id=str(tasks[1]["id"]),
                   trajectories=sampled(str(tasks[1]["id"]), 2, 1.0))
    guide = guide_for(lambda: agentrl.make("search"), tasks, tok)
    out = asyncio.run(guide([unsolved, solved]))
    assert [len(g.trajectories) for g in out] == [3, 2]
    demo = unsolved.trajectories[-1]
    assert demo.demonstrated and is_success(demo) and demo.status is Status.FINISHED
    assert demo.group_id == unsolved.id and demo.task_id == unsolved.task_id
    assert unsolved.version == 3  # labelled with the group's version: the group stays one version
    assert demo.num_policy_tokens > 0 and "answer" in str(demo.messages[-1])
    assert guide.metrics() == {"guide_demos_played": 1.0, "guide_demos_failed": 0.0}


def test_a_broken_demonstration_leaves_the_group_as_it_was(tok) -> None:
    from agentrl.envs.search import SearchEnv

    class WrongDemos(SearchEnv):
        async def demonstrate(self, task, seed=0):
            return ['<tool_call>{"name": "answer", "arguments": {"answer": "not it"}}</tool_call>']

    task = next(iter(WrongDemos().tasks("train")))
    group = Group(id="g", task_id=str(task["id"]), trajectories=sampled(str(task["id"]), 2, 0.0))
    guide = guide_for(WrongDemos, [task], tok)
    assert len(asyncio.run(guide([group]))[0].trajectories) == 2
    assert guide.metrics()["guide_demos_failed"] == 1.0


def test_guidance_for_an_env_without_demonstrations_stops_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"demo_guidance: env .* has no demonstrations") as e:
        prepare_run(f"{Path(__file__).with_name('test_demos.py')}:_NoDemos", overrides=["trainer.demo_guidance=true", f"run.dir={tmp_path}"])
    assert "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_train_learns_from_a_group_the_base_model_cannot_solve(tmp_path: Path) -> None:
    """The base model (no warm start) fails search's questions at 24 tokens a turn: every group's
    rewards are equal, so without guidance the step would have nothing to learn. With it, the
    groups gain a demonstration, and the step trains (version 1)."""
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "--env", "search", f"run.dir={tmp_path}", "run.name=r",
         "trainer.demo_guidance=true", "trainer.steps=1", "trainer.batch_groups=1", "rollout.group_size=2",
         "rollout.concurrency=2", "sampling.max_tokens=24", "trainer.warm_start.enabled=false",
         "eval.enabled=false", "--quiet"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "r"
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["guided_groups"] >= 1 and not row.get("skipped") and row["version"] == 1
    assert row["success_rate"] == 0.0  # the policy's own samples: the demonstration is not counted
    lines = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    demos = [t for t in lines if t.get("demonstration")]
    assert demos and all(t["reward"] > max(t2["reward"] for t2 in lines if not t2.get("demonstration"))
                         for t in demos)
    assert json.loads((run / "summary.json").read_text())["demo_guidance"]["guide_demos_played"] >= 1
