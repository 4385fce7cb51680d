"""OpenEnv environments as agentrl envs (docs/interop.md#openenv).

    agentrl train --env openenv:http://127.0.0.1:8000          # a running OpenEnv server
    agentrl train --env openenv:my-env:latest                  # a Docker image, started here
    agentrl train --env openenv:my_pkg.server.env:MyEnvironment  # the server-side class, in-process

The model acts through tools. A plain OpenEnv env gets one tool, `step`, whose JSON schema is the
env's Action model (its `metadata` field left out): the model calls `step(guess=3)` and the
server receives `{"guess": 3}`. An MCP env (its actions are `call_tool`) gets one tool per MCP
tool of the server, with the server's own schemas. The tool's output is the Observation (its
fields other than done/reward/metadata), the Observation's `done` ends the episode, and the
episode's outcome reward is the sum of the Observation rewards.

A task is a reset: `{"id": ..., "reset": {"seed": 3, ...}}` (the kwargs of OpenEnv's
`reset(seed=, episode_id=, **kwargs)`) and an optional "prompt". Without `env.kwargs.tasks`
(a JSONL file of such rows) the train split is seeds 0..train_tasks-1 and the test split seeds
from 1_000_000 on, so the two never share a seed.

A server that cannot be reached, or dies, or answers with an error other than a rejected action
ends that episode with status `error`; an action the server rejects is an observation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import functools
import importlib
import importlib.util
import json
import math
import re
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from agentrl.config import ConfigError
from agentrl.env import EnvError, ToolEnv, load_entry_point
from agentrl.errors import UserError
from agentrl.interop.rows import held_out, read_rows
from agentrl.tools.core import Tool, ToolResult
from agentrl.tools.jsonschema_tool import schema_tool
from agentrl.types import StepResult, Task

INSTALL = "pip install 'agentrl[openenv]'"
TEST_SEED_BASE = 1_000_000  # test seeds start here: no train seed is ever a test seed
_URL_RE = re.compile(r"^(https?|wss?)://", re.IGNORECASE)
_CLASS_RE = re.compile(r"^[\w./-]+(\.py)?:[A-Za-z_]\w*$")
_OBS_BOOKKEEPING = ("done", "reward", "metadata")
_SYSTEM = ("You are an agent acting in an environment. Act by calling its tools; each call is one "
           "step and its result is what you observe. The episode ends when the environment says so.")


class _Fatal(Exception):
    """The server cannot go on (unreachable, dead, an internal error): the episode ends with status error."""


# ---------------------------------------------------------------------------------------------
# what the spec names
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Target:
    kind: str  # "url" | "class" | "image"
    value: str


def parse_spec(spec: str) -> Target:
    """URL (http/ws), importable `module:Class` (or `file.py:Class`), else a Docker image."""
    if not spec:
        raise ConfigError("openenv: needs a spec: openenv:http://HOST:PORT, openenv:IMAGE[:TAG] or "
                          "openenv:package.module:EnvironmentClass")
    if _URL_RE.match(spec):
        return Target("url", re.sub(r"^ws", "http", spec.rstrip("/"), flags=re.IGNORECASE))
    if _CLASS_RE.match(spec):
        module = spec.rsplit(":", 1)[0]
        if module.endswith(".py") and Path(module).is_file():
            return Target("class", spec)
        with contextlib.suppress(ImportError, ValueError):
            if importlib.util.find_spec(module) is not None:
                return Target("class", spec)
    return Target("image", spec)


def _require_openenv() -> None:
    try:
        import openenv.core  # noqa: F401  (the optional extra)
    except ImportError:
        raise UserError("OpenEnv is not installed (the openenv:... envs need it)", fix=INSTALL) from None


def _environment_class(entry: str) -> type:
    from openenv.core.env_server.interfaces import Environment  # optional: the openenv extra

    module_name, name = entry.rsplit(":", 1)
    try:
        obj = load_entry_point(entry)
    except ImportError as e:
        module = _module_of(module_name)
        if module is None:
            raise ConfigError(f"openenv:{entry}: {e}") from None
        classes = [n for n, v in vars(module).items()
                   if isinstance(v, type) and issubclass(v, Environment) and v is not Environment]
        close = difflib.get_close_matches(name, classes, n=3, cutoff=0.4) or classes[:3]
        hint = f"; did you mean {', '.join(f'{module_name}:{c}' for c in close)}?" if close else \
            f"; {module_name} defines no OpenEnv Environment class"
        raise ConfigError(f"openenv:{entry}: module '{module_name}' has no class '{name}'{hint}") from None
    if not (isinstance(obj, type) and issubclass(obj, Environment)):
        raise ConfigError(f"openenv:{entry} is not an OpenEnv Environment subclass "
                          "(openenv.core.env_server.interfaces.Environment)")
    return obj


def _module_of(module_name: str) -> Any:
    """The module a failed `load_entry_point` imported (None if it did not), to list its classes."""
    if module_name.endswith(".py"):
        return sys.modules.get(f"_agentrl_user_{Path(module_name).resolve().stem}")
    return sys.modules.get(module_name)


@functools.lru_cache(maxsize=32)
def _action_class(env_cls: type) -> type:
    """The Action model an Environment class steps with: its `step` annotation, else its generic argument."""
    from openenv.core.env_server.types import Action  # optional: the openenv extra

    with contextlib.suppress(Exception):
        hinted = typing.get_type_hints(env_cls.step).get("action")
        if isinstance(hinted, type) and issubclass(hinted, Action):
            return hinted
    for base in getattr(env_cls, "__orig_bases__", ()):
        for arg in typing.get_args(base):
            if isinstance(arg, type) and issubclass(arg, Action):
                return arg
    raise ConfigError(f"openenv: cannot tell the Action class of {env_cls.__name__}: annotate "
                      "`def step(self, action: MyAction, ...)`")


# ---------------------------------------------------------------------------------------------
# tools: what the model may call
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


def _is_mcp(action_schema: dict[str, Any]) -> bool:
    props = action_schema.get("properties", {})
    return "tool_name" in props and "arguments" in props


def _step_spec(action_schema: dict[str, Any]) -> ToolSpec:
    schema = json.loads(json.dumps(action_schema))
    schema.get("properties", {}).pop("metadata", None)
    if "required" in schema:
        schema["required"] = [r for r in schema["required"] if r != "metadata"]
    schema.pop("title", None)
    description = schema.pop("description", None) or "Take one step in the environment with this action."
    return ToolSpec("step", " ".join(description.split()), schema)


def _mcp_specs(tools: list[dict[str, Any]]) -> tuple[ToolSpec, ...]:
    return tuple(ToolSpec(t["name"], t.get("description") or t["name"],
                          t.get("input_schema") or t.get("inputSchema") or {"type": "object", "properties": {}})
                 for t in tools)


@functools.lru_cache(maxsize=32)
def _remote_tools(url: str) -> tuple[tuple[ToolSpec, ...], bool]:
    """The tools of the server at `url` (fetched once per process) and whether it is an MCP env."""
    try:
        schema = httpx.get(f"{url}/schema", timeout=10.0).raise_for_status().json()["action"]
        if not _is_mcp(schema):
            return (_step_spec(schema),), False
        reply = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "method": "tools/list", "id": 1},
                           timeout=30.0).raise_for_status().json()
    except (httpx.HTTPError, KeyError, ValueError) as e:
        raise UserError(f"no OpenEnv server answers at {url} ({type(e).__name__}: {e})",
                        fix="start the server (e.g. `uvicorn my_env.server.app:app --host 127.0.0.1 "
                            "--port 8000`) or fix the address") from None
    if reply.get("error"):
        raise UserError(f"the OpenEnv MCP server at {url} could not list its tools: {reply['error']}",
                        fix="check the server's MCP tools") from None
    return _mcp_specs(reply["result"]["tools"]), True


def _is_mcp_class(env_cls: type) -> bool:
    try:  # MCPEnvironment needs fastmcp, which an OpenEnv install may lack
        from openenv.core.env_server.mcp_environment import MCPEnvironment  # optional: the openenv extra
    except ImportError:
        return False
    return issubclass(env_cls, MCPEnvironment)


@functools.lru_cache(maxsize=32)
def _class_tools(env_cls: type) -> tuple[tuple[ToolSpec, ...], bool]:
    if not _is_mcp_class(env_cls):  # an MCP env's step takes any Action: its tools are listed below
        schema = _action_class(env_cls).model_json_schema()
        if not _is_mcp(schema):
            return (_step_spec(schema),), False
    from openenv.core.env_server.mcp_types import ListToolsAction  # optional: the openenv extra

    env = env_cls()
    try:
        observation = env.step(ListToolsAction())
        tools = [t.model_dump() if hasattr(t, "model_dump") else dict(t) for t in observation.tools]
    finally:
        env.close()
    return _mcp_specs(tools), True


# ---------------------------------------------------------------------------------------------
# sessions: one episode on the server
# ---------------------------------------------------------------------------------------------

class _RemoteSession:
    """A WebSocket session on an OpenEnv server (openenv's GenericEnvClient): one server-side env."""

    def __init__(self, url: str, *, connect_timeout_s: float, step_timeout_s: float, capacity_wait_s: float) -> None:
        from openenv.core.generic_client import GenericEnvClient  # optional: the openenv extra

        self.url = url
        self.capacity_wait_s = capacity_wait_s
        self.client = GenericEnvClient(base_url=url, connect_timeout_s=connect_timeout_s,
                                       message_timeout_s=step_timeout_s)

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.capacity_wait_s
        while True:
            try:
                result = await self.client.reset(**kwargs)
                break
            except RuntimeError as e:
                # The server holds its max_concurrent_envs sessions: wait for one to end.
                if "CAPACITY_REACHED" not in str(e) or loop.time() > deadline:
                    raise _Fatal(f"OpenEnv server {self.url}: reset failed: {e}") from e
                await self.client.disconnect()
                await asyncio.sleep(0.5)
            except (OSError, asyncio.TimeoutError, ConnectionError) as e:
                raise _Fatal(f"OpenEnv server {self.url} cannot be reached: {type(e).__name__}: {e}") from e
            except Exception as e:  # websockets' ConnectionClosed and kin: the server went away
                raise _Fatal(f"OpenEnv server {self.url}: {type(e).__name__}: {e}") from e
        return {"observation": result.observation, "reward": result.reward, "done": result.done}

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        try:
            result = await self.client.step(action)
        except RuntimeError as e:
            if "VALIDATION_ERROR" in str(e) or "EXECUTION_ERROR" in str(e):
                raise ValueError(str(e).removeprefix("Server error: ")) from None  # the model reads it
            raise _Fatal(f"OpenEnv server {self.url}: {e}") from e
        except Exception as e:
            raise _Fatal(f"OpenEnv server {self.url} stopped answering: {type(e).__name__}: {e}") from e
        return {"observation": result.observation, "reward": result.reward, "done": result.done}

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.disconnect()


class _LocalSession:
    """The server-side Environment class run in this process (no server, no port)."""

    def __init__(self, env_cls: type) -> None:
        self.env_cls = env_cls
        self.env: Any = None

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.env, f"{name}_async")
        from openenv.core.env_server.interfaces import Environment  # optional: the openenv extra

        if getattr(type(self.env), f"{name}_async") is not getattr(Environment, f"{name}_async"):
            return await method(*args, **kwargs)  # the env's own async implementation
        return await asyncio.to_thread(getattr(self.env, name), *args, **kwargs)  # keep the loop free

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        try:
            if self.env is None:
                self.env = self.env_cls()
            return _as_result(await self._call("reset", **kwargs))
        except Exception as e:
            raise EnvError(f"{self.env_cls.__name__}.reset raised {type(e).__name__}: {e}") from e

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        from openenv.core.env_server.serialization import deserialize_action  # optional: the openenv extra
        from pydantic import ValidationError  # optional: the openenv extra

        try:
            typed = deserialize_action(action, _action_class(self.env_cls))
        except ValidationError as e:
            raise ValueError(f"the action does not fit {_action_class(self.env_cls).__name__}: {e}") from None
        try:
            return _as_result(await self._call("step", typed))
        except Exception as e:
            raise EnvError(f"{self.env_cls.__name__}.step raised {type(e).__name__}: {e}") from e

    async def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(env.close)


def _as_result(observation: Any) -> dict[str, Any]:
    data = observation.model_dump() if hasattr(observation, "model_dump") else dict(observation)
    return {"observation": data, "reward": data.get("reward"), "done": bool(data.get("done", False))}


# ---------------------------------------------------------------------------------------------
# the env
# ---------------------------------------------------------------------------------------------

class OpenEnvEnv(ToolEnv):
    """An OpenEnv environment (a server URL, a Docker image or an Environment class) as a ToolEnv.

    kwargs (env.kwargs in config): tasks (a JSONL file of {"id", "reset": {...}, "prompt"?,
    "split"?} rows), train_tasks / test_tasks (seeded resets when there is no file), port (the
    image's server port, default 8000), step_timeout_s, connect_timeout_s, capacity_wait_s (how
    long a reset waits for a free session on a server at its max_concurrent_envs)."""

    max_turns = 8
    tool_timeout_s = 60.0

    def __init__(self, *, spec: str, tasks: str | None = None, train_tasks: int = 64, test_tasks: int = 16,
                 port: int = 8000, step_timeout_s: float = 60.0, connect_timeout_s: float = 10.0,
                 capacity_wait_s: float = 120.0, **kwargs: Any) -> None:
        _require_openenv()
        self.target = parse_spec(spec)
        self.name = f"openenv:{spec}"
        self._task_file, self._train_n, self._test_n = tasks, int(train_tasks), int(test_tasks)
        self._timeouts = {"connect_timeout_s": connect_timeout_s, "step_timeout_s": step_timeout_s,
                          "capacity_wait_s": capacity_wait_s}
        self._env_cls: type | None = None
        self._url: str | None = None
        if self.target.kind == "class":
            self._env_cls = _environment_class(self.target.value)
            specs, self.is_mcp = _class_tools(self._env_cls)
        else:
            if self.target.kind == "image":
                # optional: Docker, for an image target only
                from agentrl.interop.docker_server import docker_server

                self._url = docker_server(self.target.value, port=port).url
            else:
                self._url = self.target.value
            specs, self.is_mcp = _remote_tools(self._url)
        self.tools = tuple(self._tool(s, step_timeout_s) for s in specs)
        self._session: _RemoteSession | _LocalSession | None = None
        super().__init__(**kwargs)

    # -- checks before any work ---------------------------------------------------------------------

    @classmethod
    def check_spec(cls, spec: str) -> None:
        """Fail in one line before any work: OpenEnv missing, an unknown class, no such image,
        no server at the URL."""
        target = parse_spec(spec)
        _require_openenv()
        if target.kind == "class":
            _environment_class(target.value)
        elif target.kind == "url":
            _remote_tools(target.value)
        else:
            from agentrl.sandboxes.docker import docker_client  # optional: Docker, for an image target only

            try:
                docker_client().images.get(target.value)
            except Exception as e:
                if type(e).__name__ != "ImageNotFound":
                    raise UserError(f"openenv:{spec}: Docker is not usable ({e})",
                                    fix="start a Docker engine (sudo scripts/docker_up.sh)") from None
                raise UserError(f"openenv:{spec}: no Docker image {spec!r} on this engine, no importable "
                                f"module '{spec.rsplit(':', 1)[0]}' and not a URL",
                                fix="build the image (`docker build -t IMAGE .`), or give "
                                    "package.module:EnvironmentClass or http://HOST:PORT") from None

    # -- tasks ----------------------------------------------------------------------------------------

    def tasks(self, split: str = "train") -> Sequence[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if self._task_file is not None:
            return _file_tasks(self._task_file, split)
        if split == "train":
            return [{"id": f"seed-{s}", "reset": {"seed": s}} for s in range(self._train_n)]
        return [{"id": f"seed-{s}", "reset": {"seed": s}}
                for s in range(TEST_SEED_BASE, TEST_SEED_BASE + self._test_n)]

    # -- the episode ----------------------------------------------------------------------------------

    def system_prompt(self, task: Task) -> str:
        return _SYSTEM

    def initial_state(self, task: Task) -> Any:
        return {"rewards": [], "done": False, "fatal": None, "first": None}

    async def setup(self, task: Task) -> None:
        await self._close_session()
        if self._env_cls is not None:
            self._session = _LocalSession(self._env_cls)
        else:
            assert self._url is not None
            self._session = _RemoteSession(self._url, **self._timeouts)
        reset_kwargs = dict(task.get("reset") or {})
        try:
            first = await self._session.reset(**reset_kwargs)
        except _Fatal as e:
            raise EnvError(str(e)) from e
        self.state["first"] = first
        if first.get("reward") is not None:
            self.state["rewards"].append(float(first["reward"]))

    def user_prompt(self, task: Task) -> str:
        first = self.state["first"]
        shown = _render(first["observation"])
        head = task.get("prompt") or "Here is the environment's first observation. Act on it with the tools."
        return f"{head}\n\n{shown}" if shown else head

    async def astep(self, action: str) -> StepResult:
        result = await super().astep(action)
        if self.state["fatal"] is not None:
            self.done = True
            raise EnvError(self.state["fatal"])
        if self.state["done"] and not result.terminated:
            if not result.truncated:  # ToolEnv scores at max_turns; the env's own end is scored here
                self.done = True
                outcome, components = await self._outcome()
                result.info.update(outcome_reward=outcome, reward_components=components)
            result.info["ended_by"] = "done"
            result = dataclasses.replace(result, terminated=True, truncated=False)
        return result

    async def reward(self, task: Task, state: Any) -> dict[str, float]:
        """The episode's return: the sum of the Observation rewards (None counts 0)."""
        rewards = state["rewards"]
        return {"reward": float(sum(rewards)), "steps_rewarded": float(len(rewards)),
                "last_reward": float(rewards[-1]) if rewards else 0.0}

    async def aclose(self) -> None:
        await self._close_session()
        await super().aclose()

    # -- internals ------------------------------------------------------------------------------------

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _tool(self, spec: ToolSpec, timeout: float) -> Tool:
        async def act(**arguments: Any) -> ToolResult:
            return await self._act(spec.name, arguments)

        return schema_tool(spec.name, spec.description, spec.parameters, act, timeout=timeout)

    async def _act(self, tool_name: str, arguments: dict[str, Any]) -> ToolResult:
        state = self.state
        if state["done"]:
            return ToolResult(error="the episode is over; no more steps are taken")
        action = {"type": "call_tool", "tool_name": tool_name, "arguments": arguments} if self.is_mcp else arguments
        assert self._session is not None
        try:
            result = await self._session.step(action)
        except ValueError as e:  # the env rejected the action: the model reads why
            return ToolResult(error=str(e))
        except (_Fatal, EnvError) as e:
            state["fatal"] = str(e)
            return ToolResult(error=str(e))
        reward = result.get("reward")
        if reward is not None:
            if not math.isfinite(float(reward)):
                state["fatal"] = f"the OpenEnv env returned a non-finite reward {reward!r}"
                return ToolResult(error=state["fatal"])
            state["rewards"].append(float(reward))
        state["done"] = bool(result.get("done"))
        observation = result.get("observation") or {}
        if self.is_mcp and observation.get("error"):
            error = observation["error"]
            return ToolResult(error=error.get("message", str(error)) if isinstance(error, dict) else str(error))
        text = _render(observation.get("result") if self.is_mcp else observation)
        return ToolResult(output=text + ("\n[the episode is over]" if state["done"] else ""))


def _render(observation: Any) -> str:
    """What the model reads of an Observation: its own fields (not done/reward/metadata); a lone
    text field as it is, anything else as JSON. An MCP result shows its text content."""
    if isinstance(observation, dict):
        if isinstance(observation.get("content"), list):  # an MCP CallToolResult
            texts = [c.get("text", "") for c in observation["content"] if isinstance(c, dict)]
            if texts:
                return "\n".join(texts)
        if "data" in observation and set(observation) <= {"data", "content", "structured_content", "is_error",
                                                           "meta"}:
            return _render(observation["data"])
        fields = {k: v for k, v in observation.items() if k not in _OBS_BOOKKEEPING}
        if len(fields) == 1 and isinstance(next(iter(fields.values())), str):
            return next(iter(fields.values()))
        return json.dumps(fields, ensure_ascii=False, default=str) if fields else ""
    if observation is None:
        return ""
    return observation if isinstance(observation, str) else json.dumps(observation, ensure_ascii=False, default=str)


def _file_tasks(path: str, split: str) -> list[Task]:
    """Rows of a JSONL task file: {"id", "reset": {...}, "prompt"?, "split"?}. Without any "split"
    field, every fifth row (index 4, 9, ...) is the test split."""
    rows: list[Task] = []
    for n, row in enumerate(read_rows(path, option="env.kwargs.tasks", scheme="openenv"), 1):
        if not isinstance(row.get("reset", {}), dict):
            raise ConfigError(f"openenv: env.kwargs.tasks: row {n} of {path}: \"reset\" must be an object of "
                              'reset kwargs, e.g. {"id": "a", "reset": {"seed": 1}}')
        rows.append({**row, "id": str(row.get("id", f"row-{n}"))})
    if any("split" in r for r in rows):
        return [r for r in rows if r.get("split", "train") == split]
    return [r for i, r in enumerate(rows) if held_out(i) == (split == "test")]


__all__ = ["OpenEnvEnv", "Target", "parse_spec"]
