"""SWEEnv end to end with scripted agents, on the real local (bubblewrap) and Docker backends:
the gold patch applied through the tools earns 1.0; editing the tests, submitting nothing or
never submitting earns <= 0 (algorithms.md §3.2 outcome levels)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl.config import SandboxConfig
from agentrl.envs.swe.env import OUTCOME_REWARDS, SWEEnv, gold_actions
from agentrl.envs.swe.schema import builtin_tasks, save_tasks

SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def docker_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        import docker  # noqa: F401
    except ImportError:
        return False
    r = subprocess.run(["docker", "image", "inspect", "agentrl-base:bookworm"], capture_output=True)
    return r.returncode == 0


BACKENDS = [
    pytest.param("local", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")),
    pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.skipif(
        not docker_ready() and os.environ.get("AGENTRL_REQUIRE_DOCKER") != "1",
        reason="needs Docker and the agentrl-base:bookworm image (scripts/docker_up.sh)")]),
]


def task_of(package: str) -> dict:
    """The shipped task of `package` with the fewest tests (fastest to grade)."""
    tasks = [t for t in builtin_tasks() if t["environment_setup"]["package"].startswith(package)]
    return min(tasks, key=lambda t: (len(t["PASS_TO_PASS"]), t["instance_id"]))


def bash_apply(patch: str) -> str:
    return call("bash", command=f"cat > /tmp/fix.diff <<'AGENTRL_EOF'\n{patch}AGENTRL_EOF\n"
                                "git apply /tmp/fix.diff && git status --short")


def edit_tests(task: dict) -> str:
    """Make the failing test trivially pass by rewriting its test file."""
    path = task["FAIL_TO_PASS"][0].split("::")[0]
    return call("bash", command=f"printf 'def test_nothing():\\n    pass\\n' > {path} && python3 -m pytest -q {path}")


async def play(env: SWEEnv, task: dict, actions: list[str]) -> tuple[float, dict, list[dict]]:
    await env.areset(task)
    steps = []
    for action in actions:
        result = await env.astep(action)
        steps.append(result.info)
        if result.terminated or result.truncated:
            return result.info["outcome_reward"], result.info["reward_components"], steps
    raise AssertionError("the episode did not end")


def make_env(backend: str, **kwargs: object) -> SWEEnv:
    cfg = SandboxConfig(backend=backend, timeout_s=60.0, pids=256, max_output_bytes=8_000_000)
    return SWEEnv(validate=False, sandbox_config=cfg, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gold_patch_through_the_tools_earns_one(backend: str) -> None:
    task = task_of("inflection")

    async def run() -> None:
        env = make_env(backend, max_turns=3)
        try:
            # the gold patch through str_replace_editor
            outcome, comps, steps = await play(env, task, gold_actions(task))
            assert outcome == 1.0 and comps["resolved"] == 1.0, comps
            assert steps[0]["step_rewards"]["edit_applied"] > 0 and steps[0]["step_rewards"]["valid_call"] > 0
            # the gold patch through bash + git apply, after running the (failing) tests
            path = task["FAIL_TO_PASS"][0].split("::")[0]
            run_tests = call("bash", command=f"python3 -m pytest -q {path} | tail -3")
            outcome, comps, steps = await play(env, task, [run_tests, bash_apply(task["patch"]), SUBMIT])
            assert steps[0]["step_rewards"]["tests_run"] > 0 and steps[1]["step_rewards"]["edit_applied"] == 0
            assert outcome == 1.0, comps
        finally:
            await env.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("backend", BACKENDS)
def test_editing_tests_or_not_submitting_earns_nothing(backend: str) -> None:
    task = task_of("inflection")

    async def run() -> None:
        env = make_env(backend, max_turns=3)
        try:
            # editing the tests to pass earns nothing: test files are restored before grading
            outcome, comps, _ = await play(env, task, [edit_tests(task), SUBMIT])
            assert outcome == OUTCOME_REWARDS["empty"] and comps["resolved"] == 0.0
            # ... also next to a source edit that does not fix the bug (graded: the tests fail)
            source = task["patch"].split()[2][2:]
            wrong = call("bash", command=f"echo '# touched' >> {source}")
            outcome, comps, _ = await play(env, task, [edit_tests(task), wrong, SUBMIT])
            assert outcome == OUTCOME_REWARDS["fail"] and comps["test_edits_dropped"] == 1.0, comps
            # submitting nothing, and never submitting
            assert (await play(env, task, [SUBMIT]))[0] == OUTCOME_REWARDS["empty"]
            outcome, comps, _ = await play(env, task, [call("bash", command="ls")] * 3)
            assert outcome == OUTCOME_REWARDS["no_submit"] and comps["submitted"] == 0.0
        finally:
            await env.aclose()

    asyncio.run(run())


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_semver_gold_and_src_layout() -> None:
    """A src/-layout package: the agent's own `python3 -m pytest` imports the repo's code."""
    task = task_of("semver")

    async def run() -> None:
        env = make_env("local")
        try:
            await env.areset(task)
            probe = await env.astep(call("bash", command="python3 -c 'import semver; print(semver.__file__)'"))
            assert "/work/src/semver/__init__.py" in probe.observation[0]["content"]
            outcome, _, _ = await play(env, task, gold_actions(task))
            assert outcome == 1.0
        finally:
            await env.aclose()

    asyncio.run(run())


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_validation_on_load_rejects_broken_tasks(tmp_path: Path) -> None:
    good = task_of("inflection")
    broken = {**good, "instance_id": "broken-1", "patch": task_of("semver")["patch"]}
    save_tasks([good, broken], tmp_path / "tasks.jsonl")
    env = SWEEnv(task_file=str(tmp_path / "tasks.jsonl"), validation_cache=str(tmp_path / "v.json"))
    assert [t["id"] for t in env.tasks("all")] == [good["id"]]
    assert env.rejected[0][0] == "broken-1" and "gold patch" in env.rejected[0][1]


def test_config_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="unknown level"):
        SWEEnv(validate=False, outcome_rewards={"great": 2.0})
    with pytest.raises(ValueError, match="must increase"):
        SWEEnv(validate=False, outcome_rewards={"no_submit": 5.0})
    with pytest.raises(ValueError, match="unknown split"):
        SWEEnv(validate=False).tasks("holdout")


def test_splits_partition_the_tasks() -> None:
    env = SWEEnv(validate=False)
    train, test = {t["id"] for t in env.tasks("train")}, {t["id"] for t in env.tasks("test")}
    assert train and test and not train & test and train | test == {t["id"] for t in env.tasks("all")}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_env_check_passes() -> None:
    from agentrl.envcheck import check_env

    report = check_env("swe", validate=False)
    assert report.ok, str(report)
