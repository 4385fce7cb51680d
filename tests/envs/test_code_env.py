"""The code env: HumanEval + procedural tasks, hidden tests graded in a real bubblewrap sandbox."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from agentrl.config import load_config
from agentrl.env import make
from agentrl.envcheck import check_env
from agentrl.envs.code import (
    FAMILIES,
    CodeEnv,
    extract_code,
    humaneval_tasks,
    load_tasks,
    procedural_task,
    run_hidden_tests,
    solution_program,
)
from agentrl.sandboxes import LocalSandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def call(name: str, **arguments: str) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def humaneval(task_id: str) -> dict:
    return next(t for t in humaneval_tasks() if t["id"] == task_id)


async def grade(task: dict, submission: str) -> bool:
    sandbox = LocalSandbox()
    try:
        return (await run_hidden_tests(sandbox, task, submission, timeout=20)).passed
    finally:
        await sandbox.close()


# -- tasks -------------------------------------------------------------------------------------


def test_humaneval_ships_offline() -> None:
    tasks = humaneval_tasks()
    assert len(tasks) == 164 and tasks[0]["id"] == "HumanEval/0"
    train, test = load_tasks("humaneval", "train"), load_tasks("humaneval", "test")
    assert len(train) + len(test) == 164 and not {t["id"] for t in train} & {t["id"] for t in test}


def test_procedural_tasks_are_seeded_and_deterministic() -> None:
    assert procedural_task(2, 7, seed=3) == procedural_task(2, 7, seed=3)
    assert procedural_task(1, 0, seed=0)["tests"] != procedural_task(1, 0, seed=1)["tests"]
    easy = [procedural_task(0, i) for i in range(len(FAMILIES[0]))]
    assert {t["family"] for t in easy} == {f.__name__.lstrip("_") for f in FAMILIES[0]}
    assert all(t["tests"].count("assert candidate(") >= 4 for t in easy)
    mixed = load_tasks("mixed", "test", difficulty=1, n=3)
    assert [t["source"] for t in mixed[:4]] == ["procedural", "humaneval"] * 2


def test_bad_task_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"difficulty must be an integer in 0\.\.3"):
        procedural_task(7, 0)
    with pytest.raises(ValueError, match="unknown code task source 'mbpp'"):
        load_tasks("mbpp")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        CodeEnv().tasks("dev")
    with pytest.raises(ValueError, match="difficulty"):
        CodeEnv(difficulty=-1)


def test_submission_forms() -> None:
    task = humaneval("HumanEval/38")  # the hidden tests call the prompt's helper encode_cyclic
    whole = "```python\ndef decode_cyclic(s):\n    return s\n```"
    program = solution_program(task, whole)
    assert "def encode_cyclic" in program and program.count("def decode_cyclic") == 1
    body = "    return s\n"
    assert solution_program(task, body) == task["prompt"] + "    return s\n"  # HumanEval completion
    assert extract_code("Here:\n```py\nx = 1\n```\nbye") == "x = 1"


# -- grading in the real sandbox ----------------------------------------------------------------


async def check_references(tasks: list[dict]) -> None:
    """Each reference solution scores 1 and a stub returning None scores 0 (no silently-wrong rewards)."""
    limit = asyncio.Semaphore(4)

    async def both(task: dict) -> tuple[bool, bool]:
        async with limit:
            stub = f"def {task['entry_point']}(*args, **kwargs):\n    return None\n"
            return await grade(task, task["solution"]), await grade(task, stub)

    results = await asyncio.gather(*(both(t) for t in tasks))
    assert [t["id"] for t, (gold, _) in zip(tasks, results) if not gold] == []
    assert [t["id"] for t, (_, stub) in zip(tasks, results) if stub] == []


async def test_reference_solutions_pass_and_stubs_fail_in_sandbox() -> None:
    procedural = [procedural_task(d, i, split=s) for d in FAMILIES for i in range(5) for s in ("train", "test")]
    await check_references([*humaneval_tasks()[::12], *procedural])


@pytest.mark.slow
async def test_every_humaneval_reference_passes_and_stub_fails() -> None:
    await check_references(list(humaneval_tasks()))


async def test_early_exit_cannot_fake_a_pass() -> None:
    task = procedural_task(0, 0)
    assert not await grade(task, "import os\nos._exit(0)\n")
    assert not await grade(task, f"{task['solution']}\nimport sys\nsys.exit(0)\n")
    main_guard = f"{task['solution']}\nif __name__ == '__main__':\n    raise SystemExit(1)\n"
    assert await grade(task, main_guard)  # imported as a module: the guard does not run


async def test_endless_submission_times_out() -> None:
    sandbox = LocalSandbox()
    try:
        outcome = await run_hidden_tests(sandbox, procedural_task(0, 0), "while True:\n    pass\n", timeout=1)
    finally:
        await sandbox.close()
    assert not outcome.passed and outcome.timed_out


# -- scripted agents through the tools ------------------------------------------------------------


async def run_episode(env: CodeEnv, task: dict, actions: list[str]) -> tuple[list[dict], dict]:
    messages = await env.areset(task)
    info: dict = {}
    for action in actions:
        result = await env.astep(action)
        messages += result.observation
        info = result.info
        if result.terminated or result.truncated:
            break
    return messages, info


async def test_scripted_agent_humaneval_0() -> None:
    env = CodeEnv(source="humaneval")
    task = humaneval("HumanEval/0")
    try:
        messages, info = await run_episode(env, task, [
            call("python", code=task["solution"] + "\nprint(has_close_elements([1.0, 2.8, 3.0], 0.3))"),
            call("submit", answer=task["solution"]),
        ])
        assert messages[2]["content"] == "True"  # the python tool ran in the episode's sandbox
        assert info["outcome_reward"] == 1.0
        assert info["reward_components"] == {"reward": 1.0, "submitted": 1.0, "tests_passed": 1.0,
                                             "tests_timed_out": 0.0, "implicit_submit": 0.0}
        prompt = messages[0]["content"] + messages[1]["content"]
        assert "def check" not in prompt and "assert candidate" not in prompt
        assert "[1.0, 2.0, 3.9, 4.0, 5.0, 2.2]" not in prompt  # a hidden test input
        _, info = await run_episode(env, task, [call("submit", answer="def has_close_elements(n, t):\n"
                                                                         "    return False\n")])
        assert info["outcome_reward"] == 0.0 and info["reward_components"]["submitted"] == 1.0
    finally:
        await env.aclose()


async def test_scripted_agent_procedural() -> None:
    env = CodeEnv(source="procedural", difficulty=0, max_turns=2)
    try:
        task = env.tasks("train")[0]
        assert "assert" not in (await env.areset(task))[1]["content"]
        _, info = await run_episode(env, task, [call("submit", answer=f"```python\n{task['solution']}```")])
        assert info["outcome_reward"] == 1.0
        wrong = task["solution"].replace("return", "return 1 +", 1)
        _, info = await run_episode(env, task, [call("submit", answer=wrong)])
        assert info["outcome_reward"] == 0.0
        _, info = await run_episode(env, task, [call("python", code="print(1)")] * 2)  # never submits
        assert info["ended_by"] == "max_turns" and info["reward_components"]["submitted"] == 0.0
    finally:
        await env.aclose()


async def test_fenced_code_without_tool_call_counts_as_submission() -> None:
    """How small models answer: a bare ```python block defining the function. With
    submit_fenced_code it is submitted (and marked); without, it is only an error observation."""
    task = procedural_task(0, 0)
    reply = f"Here is the function:\n```python\n{task['solution']}```\nIt returns the result."
    env = CodeEnv()
    try:
        _, info = await run_episode(env, task, [reply])
        assert info["outcome_reward"] == 1.0 and info["reward_components"]["implicit_submit"] == 1.0
        _, info = await run_episode(env, task, [call("submit", answer=task["solution"])])
        assert info["reward_components"]["implicit_submit"] == 0.0
        other = "```python\ndef helper(x):\n    return x\n```"  # does not define the entry point
        result = (await env.areset(task), await env.astep(other))[1]
        assert not result.terminated and "No tool call" in result.observation[0]["content"]
    finally:
        await env.aclose()
    strict = CodeEnv(submit_fenced_code=False, max_turns=1)
    try:
        _, info = await run_episode(strict, task, [reply])
        assert info["ended_by"] == "max_turns" and info["outcome_reward"] == 0.0
    finally:
        await strict.aclose()


async def test_grading_sandbox_is_not_the_agents() -> None:
    """The agent's sandbox holds no hidden tests, and what the agent plants there (a `typing.py`
    that would break the solution's `from typing import List`) does not reach the grading run."""
    env = CodeEnv(source="humaneval")
    task = humaneval("HumanEval/0")
    plant = "import os; print(sorted(os.listdir('.'))); open('typing.py', 'w').write('raise SystemExit(3)')"
    try:
        messages, info = await run_episode(env, task, [call("python", code=plant),
                                                       call("submit", answer=task["solution"])])
        assert messages[2]["content"] == "[]"
        assert await env.sandbox.read_file("typing.py") == b"raise SystemExit(3)"  # still planted
        assert info["outcome_reward"] == 1.0
    finally:
        await env.aclose()


def test_gymnasium_facade_and_config() -> None:
    cfg = load_config(env="code", overrides=["env.kwargs.difficulty=1"])
    env = make("code", **cfg.env.kwargs)
    try:
        assert isinstance(env, CodeEnv) and env.difficulty == 1
        _, info = env.reset(seed=0)
        assert env.reset(seed=0)[1] == info  # seeded reset picks the same task
        _, reward, terminated, _, _ = env.step(call("submit", answer=env.task["solution"]))
        assert terminated and reward >= 1.0
    finally:
        env.close()


def test_env_check_passes() -> None:
    report = check_env("code")
    assert report.ok, str(report)
