"""`agentrl env check`: the README example passes, each kind of broken env fails the right check,
and every built-in env that has landed passes."""

from __future__ import annotations

import asyncio
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentrl.env import BUILTIN_ENVS, Env, ToolEnv, load_entry_point
from agentrl.envcheck import CheckReport, check_env, main
from agentrl.tools import bash, python, submit, tool
from agentrl.types import StepResult

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = f"{ROOT / 'examples' / 'my_env.py'}:AddEnv"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def status(report: CheckReport) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


def test_the_readme_example_passes() -> None:
    source = (ROOT / "examples" / "my_env.py").read_text()
    env_lines = source[source.index("@tool"):source.index("register(")].strip().splitlines()
    assert len(env_lines) <= 30, f"the README example grew to {len(env_lines)} lines"
    report = check_env(EXAMPLE)
    assert report.ok, str(report)
    assert status(report)["close() releases the sandbox"] == "skip"  # AddEnv needs no sandbox
    assert report.checks and all(c.status == "pass" for c in report.checks if c.name != "close() releases the sandbox")


def test_the_registered_example_passes_through_main(capsys: pytest.CaptureFixture[str]) -> None:
    load_entry_point(EXAMPLE)  # importing the file registers "add" (and so a gymnasium spec)
    assert main(["add"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("agentrl env check: add (") and "OK: 5 passed, 0 failed, 1 skipped" in out


def test_cli_exit_codes() -> None:
    ok = subprocess.run([sys.executable, "-m", "agentrl.envcheck", EXAMPLE], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-m", "agentrl.envcheck", "no_such_module:Env"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1 and "FAIL  construct the env" in bad.stdout and "no_such_module" in bad.stdout
    assert main(["add", "not-a-pair"]) == 2


# ---------------------------------------------------------------------------------------------
# broken envs fail the check that describes them
# ---------------------------------------------------------------------------------------------


@tool
async def nap() -> str:
    """Sleep the wrong way: blocks the event loop."""
    time.sleep(1.0)  # the bug the check must catch
    return "rested"


class Base(ToolEnv):
    tools = (submit,)
    max_turns = 3

    def tasks(self, split: str = "train") -> list[dict[str, Any]]:
        return [{"id": str(i), "prompt": f"Say {i}."} for i in range(5)]

    async def reward(self, task: dict[str, Any], state: Any) -> float:
        return float(state.get("answer") == task["id"])


class BlockingEnv(Base):
    tools = (nap, submit)


class RandomPromptEnv(Base):
    def user_prompt(self, task: dict[str, Any]) -> str:
        return f"Say {task['id']} (nonce {random.random()})."


class Guess(Env):
    """A plain Env (no tools): guess the number; text feedback. `strict` breaks it on purpose."""

    def __init__(self, strict: bool = False) -> None:
        super().__init__()
        self.strict, self.target, self.left = strict, 0, 0

    def tasks(self, split: str = "train") -> list[dict[str, Any]]:
        return [{"id": str(n), "target": n} for n in range(10)]

    async def areset(self, task: dict[str, Any]) -> list[dict[str, str]]:
        self.target, self.left = task["target"], 3
        return [{"role": "user", "content": "Guess a number from 0 to 9."}]

    async def astep(self, action: str) -> StepResult:
        if self.left <= 0 and not self.strict:
            raise RuntimeError("episode over; call reset()")
        guess = action.strip()
        if not guess.isdigit():
            if self.strict:
                raise ValueError(f"not a number: {guess!r}")  # the bug: bad input must be an observation
            return StepResult([{"role": "user", "content": "Answer with a single digit."}],
                              info={"step_rewards": {}})
        self.left -= 1
        won = int(guess) == self.target
        done = won or self.left == 0
        info = {"step_rewards": {}, **({"outcome_reward": float(won), "reward_components": {}} if done else {})}
        hint = "correct" if won else ("higher" if int(guess) < self.target else "lower")
        return StepResult([{"role": "user", "content": hint}], 0.0, won, done and not won, info)


def test_blocking_tool_is_caught() -> None:
    report = check_env(BlockingEnv())
    assert status(report)["no blocking call on the event loop"] == "fail", str(report)
    detail = next(c.detail for c in report.checks if c.status == "fail")
    assert "astep with a call to 'nap' blocked the event loop for" in detail and "asyncio.to_thread" in detail


def test_nondeterministic_reset_is_caught() -> None:
    report = check_env(RandomPromptEnv())
    assert status(report)["seeded reset is deterministic"] == "fail"
    assert status(report)["no blocking call on the event loop"] == "pass"


def test_a_plain_env_passes_and_its_broken_twin_fails() -> None:
    good = check_env(Guess())
    assert good.ok, str(good)
    bad = status(check_env(Guess(strict=True)))
    assert bad["malformed actions give observations"] == "fail"
    assert bad["gymnasium check_env"] == "fail"  # gymnasium steps random text too


# ---------------------------------------------------------------------------------------------
# sandboxes: real bubblewrap through the env's private pool
# ---------------------------------------------------------------------------------------------


class ShellEnv(Base):
    tools = (python, bash, submit)
    needs_sandbox = True


class LeakyEnv(ShellEnv):
    async def aclose(self) -> None:  # the bug: forgets to give the sandbox back
        self.done = True


@needs_bwrap
def test_sandbox_env_passes_with_a_real_sandbox() -> None:
    report = check_env(ShellEnv())
    assert report.ok, str(report)
    assert status(report)["close() releases the sandbox"] == "pass"


@needs_bwrap
def test_leaked_sandbox_is_caught() -> None:
    env = LeakyEnv()
    report = check_env(env)
    assert status(report)["close() releases the sandbox"] == "fail"
    assert "left 1 sandbox(es) on loan" in str(report)
    asyncio.run(env.sandbox.sandbox.close())  # clean up what the buggy env leaked (its temp dir)


# ---------------------------------------------------------------------------------------------
# every built-in env that has landed
# ---------------------------------------------------------------------------------------------


BUILTIN_KWARGS: dict[str, dict[str, Any]] = {"summarize": {"inner_env": "code"}}  # a wrapper needs an env
SLOW_ENVS = {"swe"}  # each reset copies a repository into the sandbox; the check resets ~20 times


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_ENVS else n
                                  for n in sorted(BUILTIN_ENVS)])
def test_builtin_envs_pass(name: str) -> None:
    try:
        load_entry_point(BUILTIN_ENVS[name])
    except ImportError as e:
        pytest.skip(f"built-in env '{name}' has not landed: {e}")
    report = check_env(name, **BUILTIN_KWARGS.get(name, {}))
    assert report.ok, str(report)
