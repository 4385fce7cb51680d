"""Environments: the `Env` / `ToolEnv` base classes, the registry and the Gymnasium facade (architecture.md §3).

An environment is an async core the rollout engine drives,

    messages = await env.areset(task)          # [system, user]
    result = await env.astep(action_text)      # StepResult(observation, reward, terminated, ...)
    await env.aclose()

and a Gymnasium facade (`reset(seed=, options=)`, `step(action)`) that drives the same coroutines
on a private event loop, so `gymnasium.utils.env_checker.check_env` and
`gymnasium.make("agentrl/NAME-v0")` work.

`ToolEnv` is what most users subclass: it declares `tools`, prompts and `reward`, and the base
class parses tool calls, runs the tools (in a sandbox when `needs_sandbox`), formats observations,
stops on a terminal tool (`submit`) or at `max_turns`, and records G-RA step-reward signals
(algorithms.md §3) in `info["step_rewards"]`; their sum is `StepResult.reward`, ungated — the
trainer applies the gate.

Errors: anything the model does wrong (no call, a malformed call, an unknown tool, bad arguments,
a tool that raises or times out) becomes an observation. A bug in the env's own code (prompts,
state, reward) raises `EnvError`, which the rollout engine turns into status `error` for that one
trajectory. A sandbox limit a command runs into (out of memory, a full disk, the process limit, a
timeout) is an observation naming it, listed in `info["sandbox_faults"]`; a sandbox that dies
under a call raises `SandboxDead` (status `error`, reason `SandboxDead: sandbox_dead: ...`).
Stepping a finished env raises `EpisodeOverError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from agentrl.parsing import ParseResult, ToolCall, get_parser
from agentrl.sandboxes.common import FAULT_DEAD, SandboxDead
from agentrl.tools.core import Tool, ToolResult, example_arguments, truncate
from agentrl.tools.mcp import close_sessions, mcp_tools
from agentrl.tools.schema import ArgumentError
from agentrl.types import Message, StepResult, Task


class EnvError(RuntimeError):
    """A bug in the environment's own code (not the model's fault): ends that trajectory with
    status `error`, never the run."""


class EpisodeOverError(RuntimeError):
    """`step` on an env whose episode has ended (or never started)."""


# ---------------------------------------------------------------------------------------------
# spaces
# ---------------------------------------------------------------------------------------------

# What `sample()` draws from: ASCII, accented letters, CJK, an emoji and whitespace.
_SAMPLE_ALPHABET = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;!?()[]{}<>/\\'\"-_=+*#\n"
                    "äöüßéèçñøåł中文字日本語한국어😀")


class TextSpace(gym.spaces.Space):
    """Any unicode text, or a list of chat messages ({"role": str, "content": str, ...})."""

    def __init__(self, max_sample_length: int = 64, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_sample_length = max_sample_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return True
        return isinstance(x, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in m.items())
            for m in x
        )

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> str:
        """Random text (seeded through `space.seed`)."""
        n = int(self.np_random.integers(0, self.max_sample_length + 1))
        picks = self.np_random.integers(0, len(_SAMPLE_ALPHABET), size=n)
        return "".join(_SAMPLE_ALPHABET[i] for i in picks)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextSpace)

    def __hash__(self) -> int:
        return hash(TextSpace)

    def __repr__(self) -> str:
        return "TextSpace()"


# ---------------------------------------------------------------------------------------------
# Env
# ---------------------------------------------------------------------------------------------


class Env(gym.Env):
    """A multi-turn text environment: async core plus the Gymnasium facade.

    Subclasses implement `areset`, `astep` and `tasks` (and `aclose` if they hold resources).
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's own convention
    # Class-level defaults keep the facade working for a subclass that skips super().__init__().
    split: str = "train"
    observation_space = TextSpace()
    action_space = TextSpace()
    _loop: asyncio.AbstractEventLoop | None = None
    _facade_state = "new"

    def __init__(self, *, split: str = "train") -> None:
        self.split = split
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._facade_state = "new"  # the Gymnasium facade's episode: "new" | "running" | "done"

    # -- the async core (what the rollout engine calls) -------------------------------------------

    async def areset(self, task: Task) -> list[Message]:
        """Start an episode on `task`; return the initial conversation (system + user)."""
        raise NotImplementedError(f"{type(self).__name__} must implement areset(task)")

    async def astep(self, action: str) -> StepResult:
        """Apply the policy's action text; return the new observation messages and rewards."""
        raise NotImplementedError(f"{type(self).__name__} must implement astep(action)")

    async def afinalize(self) -> tuple[float, dict[str, float]] | None:
        """The rollout cut the episode short (context or step budget) before a terminal step:
        score the state as it stands, as (outcome_reward, reward_components). None: no outcome
        (the trajectory keeps 0). Without this, running out of context could beat a bad ending."""
        return None

    async def demonstrate(self, task: Task) -> list[str]:
        """Optional: an expert's actions for `task` (assistant texts in the env's own tool-call
        format) that reach the env's best reward when played in order. `agentrl sft` and the
        warm start play them through the real env and rollout engine (agentrl/demos.py).
        Built-in envs also take `seed=` to vary the path; an env without demonstrations keeps
        this default and works everywhere else."""
        raise NotImplementedError(f"{type(self).__name__} has no demonstrations (define async demonstrate(task))")

    def tasks(self, split: str = "train") -> Sequence[Task]:
        """The tasks of `split`; `reset()` without options picks one with its seeded RNG."""
        raise NotImplementedError(f"{type(self).__name__} defines no tasks(); pass reset(options={{'task': ...}})")

    async def aclose(self) -> None:
        """Release what the env holds (its sandbox). Idempotent."""

    # -- the Gymnasium facade ---------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            tasks = self.tasks(self.split)
            if len(tasks) == 0:
                raise ValueError(f"{type(self).__name__}.tasks({self.split!r}) is empty")
            task = tasks[int(self.np_random.integers(len(tasks)))]
        messages = self._run(self.areset(task))
        self._facade_state = "running"
        return copy.deepcopy(list(messages)), {"task_id": task.get("id") if isinstance(task, dict) else None}

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """One turn. The returned reward is the step reward plus, on the last step, the outcome
        reward (the ungated sum a Gymnasium user expects); both stay separate in `info`."""
        if self._facade_state != "running":
            raise EpisodeOverError(
                f"{type(self).__name__}: " + ("call reset() before step()" if self._facade_state == "new" else
                                              "the episode is over (terminated or truncated); call reset() "
                                              "to start a new one"))
        result = self._run(self.astep(action))
        done = bool(result.terminated or result.truncated)
        self._facade_state = "done" if done else "running"
        reward = float(result.reward) + (float(result.info.get("outcome_reward", 0.0)) if done else 0.0)
        return (copy.deepcopy(list(result.observation)), reward, bool(result.terminated),
                bool(result.truncated), copy.deepcopy(result.info))

    def close(self) -> None:
        """Release resources and the private event loop. Safe to call twice. (An env driven by a
        rollout engine on its own loop is closed there with `await env.aclose()`.)"""
        self._run(self.aclose())
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            _drive(loop, loop.shutdown_default_executor())
            loop.close()
        self._facade_state = "new"

    def _run(self, coro: Any) -> Any:
        """Drive a coroutine on this env's private event loop."""
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return _drive(self._loop, coro)


def _drive(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    """run_until_complete, from a helper thread when the caller is itself inside a running loop
    (where run_until_complete is not allowed)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return loop.run_until_complete(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(loop.run_until_complete, coro).result()


# ---------------------------------------------------------------------------------------------
# ToolEnv
# ---------------------------------------------------------------------------------------------


@dataclass
class CallOutcome:
    """One parsed call and what came of it."""

    call: ToolCall
    result: ToolResult
    valid: bool  # a known tool with valid arguments
    terminal: bool = False  # a terminal tool ran successfully


_MIN_ERROR_CHARS = 1000
_DEFAULT_SYSTEM = "You are an agent that solves the user's task step by step by calling tools."


class ToolEnv(Env):
    """An env whose actions are tool calls. Subclass and set:

    tools            the `@tool`s the model may call (`submit` or any `terminal=True` tool ends it)
    max_turns        turns before the episode is truncated
    parser           tool-call format: "hermes", "fenced" or "xml" (agentrl.parsing)
    max_output_chars a tool's output beyond this is truncated with a visible marker
    tool_timeout_s   wall-clock limit of a tool call without its own `timeout`
    needs_sandbox    get a sandbox per episode (from `sandbox_pool`, or a private pool)
    step_reward_alpha  the size α of each G-RA step-reward signal (algorithms.md §3.2)

    and implement `tasks`, `user_prompt` (or put a "prompt" in each task) and `reward`.
    Tools may have injected: sandbox, state (the per-episode `self.state`), task, env, timeout,
    or any attribute of the env by name (e.g. a `retriever`).
    """

    tools: Sequence[Tool] = ()
    max_turns: int = 8
    parser: str = "hermes"
    max_output_chars: int = 2000
    tool_timeout_s: float = 10.0
    needs_sandbox: bool = False
    step_reward_alpha: float = 0.01  # config reward.step_reward_alpha; keep α·max_turns below the outcome gap
    sandbox_config: Any = None  # agentrl.config.SandboxConfig for the private pool (None: defaults)

    def __init__(self, *, sandbox_pool: Any = None, sandbox_config: Any = None, parser: str | None = None,
                 max_turns: int | None = None, max_output_chars: int | None = None,
                 tool_timeout_s: float | None = None, step_reward_alpha: float | None = None,
                 split: str = "train", mcp_servers: Sequence[str] = ()) -> None:
        super().__init__(split=split)
        if mcp_servers:  # env.mcp_servers (docs/interop.md): their tools join the class's own
            self.tools = (*self.tools, *(t for server in mcp_servers for t in mcp_tools(server)))
        self.step_reward_alpha = self.step_reward_alpha if step_reward_alpha is None else step_reward_alpha
        self.parser = parser or self.parser
        self.max_turns = self.max_turns if max_turns is None else max_turns
        self.max_output_chars = self.max_output_chars if max_output_chars is None else max_output_chars
        self.tool_timeout_s = self.tool_timeout_s if tool_timeout_s is None else tool_timeout_s
        self.sandbox_config = sandbox_config if sandbox_config is not None else self.sandbox_config
        self.sandbox_pool = sandbox_pool
        self._check_settings()
        self._tools = {t.name: t for t in self.tools}
        self.tool_parser = get_parser(self.parser)
        self._tool_prompt = self.tool_parser.format_tools(list(self.tools))
        self._private_pool: Any = None
        self._sandbox_source: Any = None
        self._injections_checked = False
        self.sandbox: Any = None
        self.task: Task | None = None
        self.state: Any = None
        self.turn = 0
        self.done = True

    def _check_settings(self) -> None:
        name = type(self).__name__
        if not self.tools:
            raise ValueError(f"{name}.tools is empty; give it at least one @tool")
        bad = [t for t in self.tools if not isinstance(t, Tool)]
        if bad:
            raise TypeError(f"{name}.tools must hold @tool functions, got {bad[0]!r}")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"{name}.tools has duplicate names: {sorted({n for n in names if names.count(n) > 1})}")
        if not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"{name}.max_turns must be an int >= 1, got {self.max_turns!r}")
        if not isinstance(self.max_output_chars, int) or self.max_output_chars < 0:
            raise ValueError(f"{name}.max_output_chars must be an int >= 0, got {self.max_output_chars!r}")
        if not (isinstance(self.tool_timeout_s, (int, float)) and self.tool_timeout_s > 0):
            raise ValueError(f"{name}.tool_timeout_s must be > 0, got {self.tool_timeout_s!r}")
        if not (isinstance(self.step_reward_alpha, (int, float)) and self.step_reward_alpha >= 0):
            raise ValueError(f"{name}.step_reward_alpha must be >= 0, got {self.step_reward_alpha!r}")

    # -- hooks for subclasses ---------------------------------------------------------------------

    def system_prompt(self, task: Task) -> str:
        """The system message; the parser's tool descriptions are appended to it."""
        return _DEFAULT_SYSTEM

    def user_prompt(self, task: Task) -> str:
        """The first user message (default: the task's "prompt")."""
        if "prompt" not in task:
            raise NotImplementedError(f"{type(self).__name__} must implement user_prompt(task) "
                                      "or give each task a 'prompt'")
        return str(task["prompt"])

    def initial_state(self, task: Task) -> Any:
        """The per-episode `self.state` (tools may get it injected); a dict by default."""
        return {}

    async def setup(self, task: Task) -> None:
        """Prepare the episode after the sandbox is acquired (e.g. upload the task's files)."""

    async def reward(self, task: Task, state: Any) -> float | dict[str, float]:
        """The outcome reward: a float, or a dict with "reward" plus named components."""
        raise NotImplementedError(f"{type(self).__name__} must implement async reward(task, state)")

    def step_rewards(self, parsed: ParseResult, outcomes: list[CallOutcome]) -> dict[str, float]:
        """G-RA immediate-reward signals of one turn (algorithms.md §3.2, "verification-based rule
        checks"): α when the turn holds only well-formed calls to known tools with valid arguments
        (`valid_call`), and α more when they all also ran without error (`tool_ok`); else 0."""
        valid = bool(outcomes) and not parsed.errors and all(o.valid for o in outcomes)
        ok = valid and all(o.result.ok for o in outcomes)
        return {"valid_call": self.step_reward_alpha * valid, "tool_ok": self.step_reward_alpha * ok}

    def format_observation(self, call: ToolCall, result: ToolResult) -> Message:
        """The tool message the model reads: output (truncated), then the error if any."""
        text = truncate(result.output, self.max_output_chars)
        if result.error is not None:  # errors are short and must stay readable, even under a tiny limit
            error = truncate(result.error, max(self.max_output_chars, _MIN_ERROR_CHARS))
            text = f"{text}\nError: {error}" if text else f"Error: {error}"
        return {"role": "tool", "name": call.name, "content": text}

    # -- the async core ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _blame(self, what: str) -> Iterator[None]:
        """Turn an exception in the env's own code into EnvError naming where it happened."""
        try:
            yield
        except (EnvError, EpisodeOverError):
            raise
        except Exception as e:
            raise EnvError(f"{type(self).__name__}.{what} raised {type(e).__name__}: {e}") from e

    async def areset(self, task: Task) -> list[Message]:
        if not isinstance(task, dict) or "id" not in task:
            raise ValueError(f"a task must be a dict with an 'id' key, got {_short(task)}")
        await self._release_sandbox()
        self.task, self.turn, self.done = task, 0, False
        self._check_injections()
        with self._blame("initial_state"):
            self.state = self.initial_state(task)
        if self.needs_sandbox:
            pool = await self.get_pool()
            self.sandbox = await pool.get()
            self._sandbox_source = pool
        with self._blame("setup"):
            await self.setup(task)
        with self._blame("system_prompt"):
            system = self.system_prompt(task)
        with self._blame("user_prompt"):
            user = self.user_prompt(task)
        return [{"role": "system", "content": f"{system}\n\n{self._tool_prompt}"}, {"role": "user", "content": user}]

    async def astep(self, action: str) -> StepResult:
        if self.task is None:
            raise EpisodeOverError(f"{type(self).__name__}: call reset() before step()")
        if self.done:
            raise EpisodeOverError(f"{type(self).__name__}: the episode is over (it ended after turn "
                                   f"{self.turn}); call reset() to start a new one")
        if not isinstance(action, str):
            raise TypeError(f"an action must be the assistant's text (str), got {type(action).__name__}")
        self.turn += 1
        parsed = self.tool_parser.parse(action)
        observation: list[Message] = []
        if parsed.errors:
            observation.append({"role": "user", "content": self._help(
                "Your tool call could not be parsed:\n" + "\n".join(f"- {e}" for e in parsed.errors))})
        elif not parsed.calls:
            observation.append({"role": "user", "content": self._help("No tool call found in your reply.")})
        outcomes: list[CallOutcome] = []
        for call in parsed.calls:
            outcome = await self._run_call(call)
            outcomes.append(outcome)
            with self._blame("format_observation"):
                observation.append(self.format_observation(call, outcome.result))
            if outcome.terminal:
                break  # calls after a submit are not run
        terminated = any(o.terminal for o in outcomes)
        truncated = not terminated and self.turn >= self.max_turns
        with self._blame("step_rewards"):
            step_rewards = {k: float(v) for k, v in self.step_rewards(parsed, outcomes).items()}
        info: dict[str, Any] = {
            "turn": self.turn,
            "step_rewards": step_rewards,
            "tool_calls": [{"name": o.call.name, "arguments": o.call.arguments, "error": o.result.error}
                           for o in outcomes],
            "parse_errors": list(parsed.errors),
            "num_tool_calls": len(outcomes),
            "num_tool_errors": sum(not o.result.ok for o in outcomes),
            "sandbox_faults": [o.result.fault for o in outcomes if o.result.fault],  # kinds, in call order
        }
        if terminated or truncated:
            self.done = True
            outcome, components = await self._outcome()
            info.update(outcome_reward=outcome, reward_components=components,
                        ended_by=next((o.call.name for o in outcomes if o.terminal), "max_turns"))
        return StepResult(observation, sum(step_rewards.values()), terminated, truncated, info)

    async def afinalize(self) -> tuple[float, dict[str, float]] | None:
        """Score an episode the rollout ended early (e.g. SWE: no submit → its outcome level)."""
        if self.done:
            return None
        self.done = True
        return await self._outcome()

    async def aclose(self) -> None:
        await close_sessions(self)  # the MCP servers its episodes started (agentrl/tools/mcp.py)
        await self._release_sandbox()
        pool, self._private_pool = self._private_pool, None
        if pool is not None:
            await pool.close()
        self.done = True

    # -- internals --------------------------------------------------------------------------------

    def _help(self, problem: str) -> str:
        tool = next((t for t in self.tools if not t.terminal), self.tools[0])
        try:
            example = self.tool_parser.format_call(ToolCall(tool.name, example_arguments(tool)))
        except ValueError:
            example = ""
        names = ", ".join(self._tools)
        return f"{problem}\nTo act, call one of the tools ({names}) like this:\n{example}".rstrip()

    async def _run_call(self, call: ToolCall) -> CallOutcome:
        tool = self._tools.get(call.name)
        if tool is None:
            return CallOutcome(call, ToolResult(error=f"unknown tool '{call.name}'; available tools: "
                                                      f"{', '.join(self._tools)}"), valid=False)
        try:
            args = tool.validate(call.arguments)
        except ArgumentError as e:
            return CallOutcome(call, ToolResult(error=str(e)), valid=False)
        injected = {n: self._injectable(n) for n in tool.inject if n != "timeout"}
        limit = tool.timeout if tool.timeout is not None else self.tool_timeout_s
        with self._blame(f"tool '{tool.name}' wiring"):
            result = await tool.call(args, timeout=limit, **injected)
        if result.fault == FAULT_DEAD:  # no observation can come from a dead sandbox: the episode ends in error
            raise SandboxDead(f"{FAULT_DEAD}: {result.error}")
        return CallOutcome(call, result, valid=True, terminal=tool.terminal and result.ok)

    def _injectable(self, name: str) -> Any:
        builtin = {"sandbox": self.sandbox, "state": self.state, "task": self.task, "env": self}
        return builtin[name] if name in builtin else getattr(self, name)

    def _check_injections(self) -> None:
        """Once, at the first reset (subclasses set attributes after super().__init__())."""
        if self._injections_checked:
            return
        for t in self.tools:
            for n in t.inject:
                if n == "sandbox" and not self.needs_sandbox:
                    raise ValueError(f"tool '{t.name}' needs a sandbox; set needs_sandbox = True on "
                                     f"{type(self).__name__}")
                if n not in ("sandbox", "state", "task", "env", "timeout") and not hasattr(self, n):
                    raise ValueError(f"tool '{t.name}' needs injected '{n}', but {type(self).__name__} "
                                     f"has no attribute '{n}'")
        self._injections_checked = True

    async def _outcome(self) -> tuple[float, dict[str, float]]:
        with self._blame("reward"):
            value = await self.reward(self.task, self.state)
        if isinstance(value, dict):
            if "reward" not in value:
                raise EnvError(f"{type(self).__name__}.reward returned a dict without 'reward': {_short(value)}")
            components = value
        else:
            components = {"reward": value}
        try:
            components = {str(k): float(v) for k, v in components.items()}
        except (TypeError, ValueError):
            raise EnvError(f"{type(self).__name__}.reward must return numbers, got {_short(value)}") from None
        if not math.isfinite(components["reward"]):
            raise EnvError(f"{type(self).__name__}.reward returned a non-finite reward {components['reward']}")
        return components["reward"], components

    async def get_pool(self) -> Any:
        """The sandbox pool this env draws from: `sandbox_pool`, else a private one made on first use."""
        if self.sandbox_pool is not None:
            return self.sandbox_pool
        if self._private_pool is None:
            # lazy: an env that never runs code loads no sandbox backend
            from agentrl.config import SandboxConfig
            from agentrl.sandboxes import make_pool

            made = make_pool(self.sandbox_config or SandboxConfig(), size=1, name=type(self).__name__)
            self._private_pool = await made if inspect.isawaitable(made) else made
        return self._private_pool

    async def _release_sandbox(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        source, self._sandbox_source = self._sandbox_source, None
        if sandbox is not None and source is not None:
            await source.put(sandbox)


def has_demonstrations(env: Any) -> bool:
    """Whether `env` (or the env a wrapper delegates to) overrides `Env.demonstrate`."""
    inner = getattr(env, "inner", None)
    if inner is not None and type(env).demonstrate is not Env.demonstrate and getattr(env, "_delegates_demos", False):
        return has_demonstrations(inner)
    method = getattr(type(env), "demonstrate", None)
    return method is not None and method is not Env.demonstrate


async def call_demonstrate(env: Any, task: Task, seed: int = 0) -> Any:
    """`env.demonstrate(task)`, passing `seed=` when the env's method takes it (built-ins vary
    their path with it; a user's `demonstrate(task)` need not). Returns what it returns, unchecked
    (agentrl.demos checks it is a list of action strings)."""
    method = env.demonstrate
    try:
        takes_seed = "seed" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        takes_seed = False
    return await (method(task, seed=seed) if takes_seed else method(task))


def env_class_demonstrates(name: str) -> bool:
    """Whether the env registered as `name` overrides `Env.demonstrate`, told from its class
    without building it (True when it cannot be told: a factory function, not a class)."""
    cls = env_class(name)  # a registered name, "SCHEME:SPEC" or "package.module:Class"
    return not (isinstance(cls, type) and issubclass(cls, Env) and cls.demonstrate is Env.demonstrate)


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------

BUILTIN_ENVS: dict[str, str] = {
    "code": "agentrl.envs.code:CodeEnv",
    "search": "agentrl.envs.search:SearchEnv",
    "swe": "agentrl.envs.swe.env:SWEEnv",
    "summarize": "agentrl.envs.summarize:SummarizeEnv",
}
_REGISTRY: dict[str, Any] = {}
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

# Foreign environments, named "SCHEME:SPEC" (docs/interop.md): the scheme picks an adapter class,
# an ordinary `Env` subclass built as `Adapter(spec=SPEC, **kwargs)`. Each adapter imports its
# third-party package lazily; `extra` is the pip extra that installs it.
@dataclasses.dataclass(frozen=True)
class Scheme:
    entry_point: str  # "agentrl.interop.MODULE:Class"
    extra: str  # pip install 'agentrl[EXTRA]'
    example: str  # one spec that shows the form, for error messages


SCHEMES: dict[str, Scheme] = {}


def register_scheme(name: str, entry_point: str, *, extra: str, example: str) -> None:
    """Name a family of foreign envs: `make("NAME:SPEC")` builds `entry_point(spec=SPEC, ...)`."""
    SCHEMES[name] = Scheme(entry_point, extra, example)


def split_scheme(name: str) -> tuple[Scheme, str] | None:
    """(the scheme, its spec) when `name` is "SCHEME:SPEC" for a registered scheme, else None.
    Checked before "package.module:Class", so a scheme shadows a top-level module of its name."""
    prefix, sep, spec = name.partition(":")
    scheme = SCHEMES.get(prefix) if sep else None
    return (scheme, spec) if scheme is not None else None


def gym_id(name: str) -> str:
    """The Gymnasium id of a registered agentrl env."""
    return f"agentrl/{name}-v0"


def register(name: str, cls_or_entry_point: type[Env] | str | Callable[..., Env]) -> None:
    """Register an env class (or a lazy "package.module:Class" string) as `name`, for
    `agentrl.make(name)` and `gymnasium.make("agentrl/NAME-v0")`. Re-registering replaces."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name.endswith(("-v0",)):
        raise ValueError(f"env name must match {_NAME_RE.pattern} (without a -vN suffix), got {name!r}")
    target = cls_or_entry_point
    if isinstance(target, str):
        if target.count(":") != 1 or not all(target.split(":")):
            raise ValueError(f"an entry point must look like 'package.module:Class', got {target!r}")
    elif not callable(target):
        raise TypeError(f"register({name!r}, ...) needs an Env class or 'package.module:Class', got {_short(target)}")
    _REGISTRY[name] = target
    gym.envs.registry.pop(gym_id(name), None)  # replace quietly instead of gymnasium's override warning
    gym.register(id=gym_id(name), entry_point=target)


def _entry_point(target: Any) -> str:
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"


def registry() -> dict[str, str]:
    """Registered env names → their entry points ("package.module:Class")."""
    return {name: _entry_point(target) for name, target in _REGISTRY.items()}


def list_envs() -> list[str]:
    return sorted(_REGISTRY)


def load_entry_point(entry_point: str) -> Any:
    """Import "package.module:Attr" with an error that says what failed."""
    if entry_point.count(":") != 1:
        raise ValueError(f"an entry point must look like 'package.module:Class', got {entry_point!r}")
    module_name, attr = entry_point.split(":")
    try:
        module = _import_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"cannot import module '{module_name}' for env '{entry_point}': {e}") from e
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ImportError(f"module '{module_name}' has no attribute '{attr}' (env '{entry_point}')") from None
    return obj


def _import_file(path: str) -> Any:
    """Import a module from a file path ("my_env.py:MyEnv" works like "my_env:MyEnv")."""
    file = Path(path).resolve()
    if not file.is_file():
        raise ImportError(f"no such file: {path}")
    module_name = f"_agentrl_user_{file.stem}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up here
    spec.loader.exec_module(module)
    return module


def env_class(name: str) -> Any:
    """The class (or factory) `make(name)` calls, imported but not built."""
    if (found := split_scheme(name)) is not None:
        return load_entry_point(found[0].entry_point)
    target = _REGISTRY.get(name, name)
    return load_entry_point(target) if isinstance(target, str) else target


def make(name: str, **kwargs: Any) -> Env:
    """Build a registered env by name, a foreign env by "SCHEME:SPEC" (`SCHEMES`), or a user's
    class by "package.module:Class"."""
    if (found := split_scheme(name)) is not None:
        scheme, spec = found
        env = load_entry_point(scheme.entry_point)(spec=spec, **kwargs)
        env.spec = dataclasses.replace(gym.spec(FOREIGN_GYM_ID), kwargs={"name": name, **kwargs})
        return env
    if name in _REGISTRY:
        target = _REGISTRY[name]
    elif ":" in name:
        target = name
    else:
        raise ValueError(f"unknown env '{name}'; registered: {', '.join(list_envs()) or 'none'} "
                         "(or pass 'package.module:Class')")
    factory = load_entry_point(target) if isinstance(target, str) else target
    env = factory(**kwargs)
    if not isinstance(env, Env):
        raise TypeError(f"env '{name}' built a {type(env).__name__}, not an agentrl.Env subclass")
    if name in _REGISTRY:
        env.spec = dataclasses.replace(gym.spec(gym_id(name)), kwargs=dict(kwargs))
    return env


for _name, _target in BUILTIN_ENVS.items():
    register(_name, _target)

# The ecosystems agentrl adapts (docs/interop.md). A user's own scheme: register_scheme(...).
for _name, _cls, _extra, _example in [
    ("openenv", "agentrl.interop.openenv:OpenEnvEnv", "openenv", "openenv:http://127.0.0.1:8000"),
    ("trl", "agentrl.interop.trl:TRLEnv", "trl", "trl:my_pkg.envs:MyEnv"),
    ("reasoning_gym", "agentrl.interop.reasoning_gym:ReasoningGymEnv", "reasoning-gym",
     "reasoning_gym:chain_sum+basic_arithmetic"),
    ("textarena", "agentrl.interop.textarena:TextArenaEnv", "textarena", "textarena:GuessTheNumber-v0"),
    ("verifiers", "agentrl.interop.verifiers:VerifiersEnv", "verifiers", "verifiers:my_pkg.my_env"),
]:
    register_scheme(_name, _cls, extra=_extra, example=_example)

# gymnasium.make("agentrl/env-v0", name="reasoning_gym:chain_sum") builds any env agentrl can name
# (a gymnasium id cannot carry a URL or a module path).
FOREIGN_GYM_ID = "agentrl/env-v0"
gym.envs.registry.pop(FOREIGN_GYM_ID, None)
gym.register(id=FOREIGN_GYM_ID, entry_point="agentrl.env:make")

__all__ = [
    "BUILTIN_ENVS", "FOREIGN_GYM_ID", "SCHEMES", "CallOutcome", "Env", "EnvError", "EpisodeOverError",
    "Scheme", "TextSpace", "ToolEnv", "env_class", "gym_id", "has_demonstrations", "list_envs",
    "load_entry_point", "make", "register", "register_scheme", "registry", "split_scheme",
]
