"""`agentrl env check NAME`: is this environment safe to train on?

Runs `gymnasium.utils.env_checker.check_env` and agentrl's own checks:

- a seeded reset is deterministic;
- malformed actions (bad JSON, an unknown tool, an unclosed block, arbitrary text) come back as
  observations, never exceptions; every step's info carries "step_rewards" and the last one
  "outcome_reward" and "reward_components";
- stepping a finished episode raises a clear error;
- reset/step/close never block the event loop (a watchdog coroutine measures the loop's lag
  while each one runs; a blocking call in async code starves every other trajectory);
- `close()` gives the sandbox back to its pool;
- with `--adversarial`: known reward hacks (agentrl/reward_hacks.py, or the env's own
  `adversarial_submissions(task)`) submitted through the terminal tool score no better than an
  empty or plainly wrong answer.

    report = check_env("add")          # or an Env instance, or "package.module:Class"
    print(report); report.ok
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import itertools
import math
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from agentrl.env import Env, ToolEnv, has_demonstrations, make, registry
from agentrl.parsing import ToolCall
from agentrl.tools.core import example_arguments

# Texts that are not valid tool calls in any format: the env must answer each with an observation.
MALFORMED_ACTIONS = (
    "<tool_call>{not json</tool_call>",
    '<tool_call>{"name": "no_such_tool_xyz", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "no_such_tool_xyz"',
    "```python\nprint('unclosed block')",
    "<function=no_such_tool_xyz><parameter=x>1",
    "",
    "just some text with no tool call at all ✓",
)
MAX_STEPS_TO_FINISH = 200
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # gymnasium colours its warnings


@dataclass
class Check:
    name: str
    status: str  # "pass" | "fail" | "skip"
    detail: str = ""


@dataclass
class CheckReport:
    env: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def __str__(self) -> str:
        lines = [f"agentrl env check: {self.env}"]
        for c in self.checks:
            lines.append(f"  {c.status.upper():4s}  {c.name}")
            lines.extend(f"          {line}" for line in c.detail.splitlines() if line.strip())
        counts = {s: sum(c.status == s for c in self.checks) for s in ("pass", "fail", "skip")}
        verdict = "OK" if self.ok else "FAILED"
        lines.append(f"{verdict}: {counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
        return "\n".join(lines)


class _CountingPool:
    """Wraps a sandbox pool to count sandboxes on loan, so the check can see one leak."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.out = 0

    async def get(self, *args: Any, **kwargs: Any) -> Any:
        sandbox = await self.inner.get(*args, **kwargs)
        self.out += 1
        return sandbox

    async def put(self, sandbox: Any) -> None:
        self.out -= 1
        await self.inner.put(sandbox)


async def _watched(coro: Any, interval: float = 0.01) -> tuple[Any, float]:
    """Run `coro` while a watchdog ticks every `interval` s; return its result and the longest
    time the loop could not run the watchdog (beyond `interval`)."""
    loop = asyncio.get_running_loop()
    ticks = [loop.time()]

    async def watch() -> None:
        while True:
            await asyncio.sleep(interval)
            ticks.append(loop.time())

    task = asyncio.create_task(watch())
    await asyncio.sleep(0)  # let the watchdog arm before the coroutine runs
    try:
        result = await coro
    finally:
        task.cancel()
        ticks.append(loop.time())  # a coroutine that blocks and never yields shows up here
    return result, max(0.0, max(b - a for a, b in itertools.pairwise(ticks)) - interval)


def _tool_env(env: Env) -> ToolEnv | None:
    """The ToolEnv itself, or the one a wrapper (e.g. SummarizeEnv) holds as `.inner`."""
    for _ in range(8):
        if isinstance(env, ToolEnv):
            return env
        env = getattr(env, "inner", None)
    return None


def _sample_actions(env: Env) -> list[tuple[str, str]]:
    """(label, action) pairs that exercise every tool once (terminal tools last)."""
    inner = _tool_env(env)
    if inner is None:
        return [("a random action", env.action_space.sample())]
    actions = []
    for t in sorted(inner.tools, key=lambda t: t.terminal):
        try:
            actions.append((f"a call to '{t.name}'", inner.tool_parser.format_call(ToolCall(t.name, example_arguments(t)))))
        except ValueError:
            continue  # the format cannot express this call
    return actions


def _is_messages(obs: Any, env: Env) -> bool:
    return isinstance(obs, list) and obs in env.observation_space


class _Checker:
    def __init__(self, env: Env, report: CheckReport, max_loop_lag_s: float) -> None:
        self.env, self.report, self.max_loop_lag_s = env, report, max_loop_lag_s
        self.pool: _CountingPool | None = None
        self.factory: Callable[[], Any] = type(env)
        self.original_pool: Any = None

    def run(self, name: str, fn: Callable[[], str | None]) -> None:
        """One check: returns a detail string (pass), raises AssertionError (fail) or _Skip (skip)."""
        try:
            detail = fn() or ""
            self.report.checks.append(Check(name, "pass", detail))
        except _Skip as e:
            self.report.checks.append(Check(name, "skip", str(e)))
        except AssertionError as e:
            self.report.checks.append(Check(name, "fail", str(e) or "assertion failed"))
        except Exception as e:
            tb = traceback.format_exception(type(e), e, e.__traceback__)
            self.report.checks.append(Check(name, "fail", f"{type(e).__name__}: {e}\n{''.join(tb[-3:])}"))

    def install_pool(self) -> None:
        inner = _tool_env(self.env)
        if inner is not None and inner.needs_sandbox:
            self.original_pool = inner.sandbox_pool
            self.pool = _CountingPool(self.env._run(inner.get_pool()))
            inner.sandbox_pool = self.pool

    def gymnasium(self) -> str:
        from gymnasium.utils.env_checker import check_env as gym_check_env  # lazy: only this check needs it

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gym_check_env(self.env)
        notes = sorted({_ANSI.sub("", str(w.message)).removeprefix("WARN: ") for w in caught})
        return "\n".join(f"warning: {n}" for n in notes)

    def seeded_reset(self) -> str:
        obs_a, info_a = self.env.reset(seed=1234)
        obs_b, info_b = self.env.reset(seed=1234)
        assert _is_messages(obs_a, self.env), f"reset() must return a list of chat messages, got {obs_a!r:.200}"
        assert obs_a == obs_b, "reset(seed=1234) twice gave different observations"
        assert info_a == info_b, f"reset(seed=1234) twice gave different infos: {info_a} vs {info_b}"
        return ""

    def malformed(self) -> str:
        env = self.env
        env.reset(seed=0)
        for action in MALFORMED_ACTIONS:
            obs, reward, terminated, truncated, info = env.step(action)
            assert _is_messages(obs, env) and obs, f"step({action!r}) gave no observation messages: {obs!r:.200}"
            assert math.isfinite(reward), f"step({action!r}) gave reward {reward}"
            self._check_info(info, terminated or truncated, action)
            if terminated or truncated:
                env.reset(seed=0)
        return f"{len(MALFORMED_ACTIONS)} malformed actions each gave an observation"

    def _check_info(self, info: dict[str, Any], done: bool, action: str) -> None:
        if not isinstance(self.env, ToolEnv):
            return
        rewards = info.get("step_rewards")
        assert isinstance(rewards, dict) and all(isinstance(v, float) for v in rewards.values()), \
            f"info['step_rewards'] must be a dict of floats (step {action!r:.60}), got {rewards!r}"
        if done:
            assert isinstance(info.get("outcome_reward"), float), "the last step's info needs 'outcome_reward'"
            assert isinstance(info.get("reward_components"), dict), "the last step's info needs 'reward_components'"

    def finished_raises(self) -> str:
        env = self.env
        env.reset(seed=0)
        steps, done, info = 0, False, {}
        while not done and steps < MAX_STEPS_TO_FINISH:
            _, _, terminated, truncated, info = env.step("I am not calling any tool.")
            steps, done = steps + 1, terminated or truncated
        if not done:
            raise _Skip(f"the episode did not end within {MAX_STEPS_TO_FINISH} steps without tool calls")
        self._check_info(info, True, "no call")
        try:
            env.step("one step too many")
        except Exception as e:
            return f"ended after {steps} steps; the next step raised {type(e).__name__}: {e}"
        raise AssertionError("step() after the episode ended did not raise")

    def no_blocking(self) -> str:
        env = self.env
        task = env.tasks(env.split)[0]
        worst: list[tuple[float, str]] = []

        async def episode() -> None:
            _, lag = await _watched(env.areset(copy.deepcopy(task)))
            worst.append((lag, "areset"))
            inner = _tool_env(env)
            for label, action in _sample_actions(env):
                if inner is not None and inner.done:
                    _, lag = await _watched(env.areset(copy.deepcopy(task)))
                    worst.append((lag, "areset"))
                _, lag = await _watched(env.astep(action))
                worst.append((lag, f"astep with {label}"))

        env._run(episode())
        lag, where = max(worst)
        assert lag <= self.max_loop_lag_s, (
            f"{where} blocked the event loop for {lag:.2f} s (limit {self.max_loop_lag_s} s): a synchronous "
            "call in async code; run it with `await asyncio.to_thread(...)` or use an async API")
        return f"longest loop stall {lag * 1000:.0f} ms ({where}) over {len(worst)} calls"

    def close_releases(self) -> str:
        env = self.env
        if self.pool is None:
            raise _Skip("the env holds no sandbox")
        env.reset(seed=0)
        assert self.pool.out == 1, f"after reset the env holds {self.pool.out} sandboxes, expected 1"
        env.close()
        assert self.pool.out == 0, f"close() left {self.pool.out} sandbox(es) on loan from the pool"
        assert getattr(_tool_env(env), "sandbox", None) is None, "close() left env.sandbox set"
        env.close()  # twice is allowed
        return "the sandbox went back to the pool; a second close() is harmless"


    def demonstrations(self, sample: int = 3) -> str:
        """Play the demonstrations of a few train tasks through the real rollout engine (the
        embedded model's chat template), each on a fresh env (the rollout closes its env); each
        must reach the env's best reward."""
        # heavy lazy load: the rollout engine and the tokenizer (transformers)
        from agentrl.demos import demonstration_problem, play_demonstration
        from agentrl.models import load_tokenizer, resolve_model

        tasks = list(self.env.tasks("train"))
        picks = [tasks[i * len(tasks) // sample] for i in range(min(sample, len(tasks)))]
        tokenizer = load_tokenizer(resolve_model("smollm2-135m"))
        for i, task in enumerate(picks):
            traj = self.env._run(play_demonstration(self.factory, task, tokenizer, seed=i, max_tokens=4096,
                                                    max_context_tokens=32768, verify_template=i == 0))
            problem = demonstration_problem(traj)
            assert problem is None, f"the demonstration of task {task.get('id')} (seed {i}) {problem}"
        return f"{len(picks)} demonstration(s) of train tasks reached the best reward"

    def adversarial(self) -> str:
        from agentrl.reward_hacks import (  # lazy: --adversarial only
            SHELL_HACKS,
            adversarial_pass,
            generic_hacks,
        )

        inner = _tool_env(self.env)
        if inner is None:
            raise _Skip("not a ToolEnv: no terminal tool to submit hacks through")
        wins = self.env._run(adversarial_pass(inner))
        assert not wins, "reward hacks scored above an empty/wrong answer:\n" + "\n".join(
            f"  task {t}: {name} got {r:g} (baseline {b:g})" for t, name, r, b in wins)
        if callable(getattr(inner, "adversarial_submissions", None)):
            return "the env's own hacks scored no better"
        shell = any(t.name == "bash" for t in inner.tools)
        count = len(generic_hacks()) + (len(SHELL_HACKS) if shell else 0)
        return f"{count} generic hacks{' (shell hacks through bash included)' if shell else ''} scored no better"


class _Skip(Exception):
    pass


def check_env(name_or_env: str | Env, *, max_loop_lag_s: float = 0.5, adversarial: bool = False,
              **kwargs: Any) -> CheckReport:
    """Check an env (by registered name, "package.module:Class", or an instance); `adversarial`
    adds the reward-hack pass."""
    label = name_or_env if isinstance(name_or_env, str) else type(name_or_env).__name__
    if isinstance(name_or_env, str) and name_or_env in registry():
        label = f"{name_or_env} ({registry()[name_or_env]})"
    report = CheckReport(str(label))
    try:
        env = make(name_or_env, **kwargs) if isinstance(name_or_env, str) else name_or_env
    except Exception as e:
        report.checks.append(Check("construct the env", "fail", f"{type(e).__name__}: {e}"))
        return report
    if not isinstance(env, Env):
        report.checks.append(Check("construct the env", "fail", f"{type(env).__name__} is not an agentrl.Env"))
        return report
    checker = _Checker(env, report, max_loop_lag_s)
    try:
        try:
            checker.install_pool()
        except Exception as e:
            report.checks.append(Check("get the sandbox pool", "fail", f"{type(e).__name__}: {e}"))
            return report
        # Fresh envs of the same kind: by name and arguments, else the class with no arguments.
        checker.factory = (lambda: make(name_or_env, **kwargs)) if isinstance(name_or_env, str) else type(env)
        checker.run("gymnasium check_env", checker.gymnasium)
        checker.run("seeded reset is deterministic", checker.seeded_reset)
        checker.run("malformed actions give observations", checker.malformed)
        checker.run("stepping a finished episode raises", checker.finished_raises)
        checker.run("no blocking call on the event loop", checker.no_blocking)
        if adversarial:  # before close_releases, which closes the env
            checker.run("reward hacks score no better than a wrong answer", checker.adversarial)
        if has_demonstrations(env):  # optional: an env without demonstrate() has nothing to check
            checker.run("demonstrations reach the best reward", checker.demonstrations)  # before close
        checker.run("close() releases the sandbox", checker.close_releases)
    finally:
        with contextlib.suppress(Exception):
            env.close()
        inner = _tool_env(env)
        if checker.pool is not None and inner is not None:
            inner.sandbox_pool = checker.original_pool
    return report


def _parse_kwargs(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"env argument {item!r} must look like key=value")
        key, raw = item.split("=", 1)
        out[key] = yaml.safe_load(raw) if raw else ""
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`agentrl env check NAME [key=value ...]`; exit status 1 if any check fails."""
    parser = argparse.ArgumentParser(prog="agentrl env check", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="registered env name, package.module:Class, or path/to/file.py:Class")
    parser.add_argument("kwargs", nargs="*", help="constructor arguments as key=value (values read as YAML)")
    parser.add_argument("--max-loop-lag", type=float, default=0.5, help="seconds the event loop may stall")
    parser.add_argument("--adversarial", action="store_true",
                        help="also submit known reward hacks and require they score no better than a wrong answer")
    args = parser.parse_args(argv)
    if os.getcwd() not in sys.path:  # let "my_pkg.my_mod:MyEnv" resolve from the working directory
        sys.path.insert(0, os.getcwd())
    try:
        kwargs = _parse_kwargs(args.kwargs)
    except ValueError as e:
        print(f"agentrl env check: {e}", file=sys.stderr)
        return 2
    report = check_env(args.name, max_loop_lag_s=args.max_loop_lag, adversarial=args.adversarial, **kwargs)
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
