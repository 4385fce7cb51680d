"""TRL's environment contract as an agentrl env: `--env trl:pkg.module:Class env.kwargs.tasks=rows.jsonl`.

    agentrl train --env trl:my_envs:WordleEnv env.kwargs.tasks=rows.jsonl \
        'env.kwargs.reward_funcs=[my_envs:solved]'

The class is what `GRPOTrainer(environment_factory=Class)` takes: built with no arguments (one
instance per agentrl env, reused across episodes as TRL pools them); `reset(**row)` starts an
episode on one dataset row and returns text appended to the row's last prompt message (or None);
every public method other than `reset` and `get_reward` is a tool, its JSON schema made by
transformers' `get_json_schema` from the type hints and the Google-style docstring (what TRL
uses), and a call runs the method on the instance. As in TRL's tool loop, a reply without a tool
call is the final answer and ends the episode (so does `max_turns`). The reward is the sum of
the reward functions named in `reward_funcs` (weights `reward_weights`, default 1), called with
TRL's keywords — `prompts`, `completions` (the episode's messages after the prompt),
`environments` (the instance), the row's other columns as one-element lists, `trainer_state`
(None), `log_extra` / `log_metric` — plus the instance's `get_reward()` when it defines one. A
function returning None for the row is left out, as in TRL.

Rows are the JSONL file `tasks`; the held-out split is the file `test_tasks`, or else every
fifth row of `tasks` (rows 4, 9, ...), never trained on.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.config import ConfigError
from agentrl.env import ToolEnv, load_entry_point
from agentrl.interop.packages import check_known, require
from agentrl.interop.rows import held_out, read_rows
from agentrl.tools.core import Tool
from agentrl.types import Message, StepResult, Task

SPLITS = ("train", "test")
_NOT_TOOLS = ("reset", "get_reward")  # TRL's reserved methods
_NOT_COLUMNS = ("prompt", "completion", "completion_ids")  # what TRL does not forward as row columns


def load_ref(ref: str, kind: str) -> Any:
    """"package.module:Name" (or "file.py:Name"), ConfigError naming close matches when the
    module has no such name."""
    module_name, sep, attr = ref.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"trl: the {kind} '{ref}' must look like package.module:Name")
    if not module_name.endswith(".py"):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and (module_name == e.name or module_name.startswith(f"{e.name}.")):
                raise ConfigError(f"trl: no module '{module_name}' for the {kind} '{ref}' (is it on "
                                  "PYTHONPATH, or the working directory?)") from None
            raise
        check_known(kind, attr.split(".")[0], [n for n in vars(module) if not n.startswith("_")], scheme="trl")
    return load_entry_point(ref)


def method_tools(instance: Any) -> list[Tool]:
    """The instance's public methods as tools, as TRL exposes them (schema from get_json_schema)."""
    from transformers.utils import get_json_schema  # transformers is heavy: loaded once an env is built

    tools = []
    for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
        if name.startswith("_") or name in _NOT_TOOLS:
            continue
        try:
            spec = get_json_schema(method)["function"]
        except Exception as e:  # transformers' own exception types for a missing docstring or hint
            raise ConfigError(f"trl: {type(instance).__name__}.{name} cannot be a tool: {e} (TRL needs a type "
                              "hint per argument and a Google-style docstring with an Args: section)") from None
        try:
            hints = typing.get_type_hints(method)
        except Exception:  # an unresolvable annotation: the schema still validates the JSON type
            hints = {}
        params = spec.get("parameters") or {"type": "object", "properties": {}}
        tools.append(Tool(name=name, description=spec.get("description", ""), parameters=params,
                          fn=_call_method(name, inspect.iscoroutinefunction(method)),
                          hints={p: hints.get(p, Any) for p in params.get("properties", {})}, inject=("env",)))
    return tools


def _call_method(name: str, is_async: bool) -> Callable[..., Any]:
    """A tool function that runs `name` on the episode's instance (the injected env's)."""
    if is_async:
        async def call_async(env: Any = None, **arguments: Any) -> Any:
            return await getattr(env.instance, name)(**arguments)
        return call_async

    def call(env: Any = None, **arguments: Any) -> Any:
        return getattr(env.instance, name)(**arguments)
    return call


class TRLEnv(ToolEnv):
    """A TRL `environment_factory` class, its dataset rows as tasks and its reward functions.

    Args (`env.kwargs`):
        spec: "package.module:Class" (or "path/to/file.py:Class"), the part after `trl:`
        tasks: JSONL of dataset rows (each may hold "prompt": text or chat messages, and "id")
        test_tasks: JSONL of held-out rows (default: every fifth row of `tasks`)
        reward_funcs: ["package.module:function", ...] in TRL's reward-function signature
        reward_weights: one weight per reward function (default 1 each)
        system_prompt: the system message when a row's prompt has none
    and every `ToolEnv` option (max_turns, parser, ...).
    """

    def __init__(self, spec: str, tasks: str | None = None, test_tasks: str | None = None,
                 reward_funcs: list[str] | str | None = None, reward_weights: list[float] | None = None,
                 system_prompt: str | None = None, **kwargs: Any) -> None:
        cls = self.check_spec(spec)
        if tasks is None:
            raise ConfigError(f"trl:{spec} needs its dataset rows: set env.kwargs.tasks=ROWS.jsonl")
        funcs = [reward_funcs] if isinstance(reward_funcs, str) else list(reward_funcs or [])
        self.reward_funcs = [load_ref(ref, "reward function") for ref in funcs]
        self.reward_weights = [float(w) for w in (reward_weights or [1.0] * len(funcs))]
        if len(self.reward_weights) != len(self.reward_funcs):
            raise ConfigError(f"trl: {len(self.reward_weights)} reward_weights for {len(funcs)} reward_funcs")
        try:
            self.instance = cls()  # TRL's factory is called with no arguments
        except Exception as e:
            raise ConfigError(f"trl: {spec}() raised {type(e).__name__}: {e}") from e
        if not callable(getattr(self.instance, "reset", None)):
            raise ConfigError(f"trl: {spec} has no reset method (TRL's contract: reset(**row) -> str | None)")
        self.owns_reward = callable(getattr(self.instance, "get_reward", None))
        if not self.reward_funcs and not self.owns_reward:
            raise ConfigError(f"trl:{spec} has no reward: set env.kwargs.reward_funcs=[package.module:function] "
                              "or define get_reward() on the class")
        self.tools = tuple(method_tools(self.instance))
        if not self.tools:
            raise ConfigError(f"trl: {spec} has no public method to call as a tool")
        super().__init__(**kwargs)
        self.default_system = system_prompt
        self._given_ids: set[str] = set()  # ids the rows carried themselves (passed on to reset)
        ided = self._with_ids(tasks, "tasks")
        if test_tasks is not None:
            self._splits = {"train": ided, "test": self._with_ids(test_tasks, "test_tasks")}
        else:
            self._splits = {"train": [r for i, r in enumerate(ided) if not held_out(i)],
                            "test": [r for i, r in enumerate(ided) if held_out(i)]}
        self._prompt: list[Message] = []
        self._completion: list[Message] = []

    def _with_ids(self, path: str, what: str) -> list[Task]:
        """The rows of `path` as tasks: a row's own "id", else trl/FILE_STEM/LINE_INDEX."""
        tasks = []
        for i, row in enumerate(read_rows(path, option=f"env.kwargs.{what}", scheme="trl")):
            if "id" in row:
                self._given_ids.add(str(row["id"]))
            tasks.append({**row, "id": str(row.get("id", f"trl/{Path(path).stem}/{i}"))})
        return tasks

    @classmethod
    def check_spec(cls, spec: str) -> Any:
        """Before any work: the class imports (close matches named when it does not); returns it."""
        require("transformers", scheme="trl")
        if ":" not in spec:
            raise ConfigError(f"trl: '{spec}' must name a class: trl:package.module:Class")
        env_cls = load_ref(spec, "class")
        if not callable(env_cls):
            raise ConfigError(f"trl: {spec} is a {type(env_cls).__name__}, not a class")
        return env_cls

    def tasks(self, split: str = "train") -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        return self._splits[split]

    # -- the episode --------------------------------------------------------------------------------

    def _row(self, task: Task) -> dict[str, Any]:
        """The dataset row as TRL passes it: the id agentrl gave a row without one left out."""
        return task if task["id"] in self._given_ids else {k: v for k, v in task.items() if k != "id"}

    async def setup(self, task: Task) -> None:
        """`reset(**row)` (off the event loop: user code may block), then the prompt it extends."""
        row = self._row(task)
        observation = await asyncio.to_thread(self.instance.reset, **row)
        prompt = row.get("prompt", [{"role": "user", "content": ""}])
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if observation is not None:
            messages[-1] = {**messages[-1], "content": f"{messages[-1].get('content', '')}{observation}"}
        self._prompt, self._completion = messages, []

    def system_prompt(self, task: Task) -> str:
        given = [str(m.get("content", "")) for m in self._prompt if m.get("role") == "system"]
        return "\n\n".join(given) if given else (self.default_system or super().system_prompt(task))

    def user_prompt(self, task: Task) -> str:
        return str(self._prompt[-1].get("content", ""))

    async def areset(self, task: Task) -> list[Message]:
        system, _ = await super().areset(task)
        return [system, *({"role": m["role"], "content": str(m.get("content", ""))}
                          for m in self._prompt if m.get("role") != "system")]

    async def astep(self, action: str) -> StepResult:
        if self.task is not None and not self.done and isinstance(action, str):
            parsed = self.tool_parser.parse(action)
            if not parsed.calls and not parsed.errors:  # TRL: a reply without a tool call is the answer
                self.turn += 1
                self.done = True
                self._completion.append({"role": "assistant", "content": action})
                outcome, components = await self._outcome()
                info = {"turn": self.turn, "step_rewards": {}, "tool_calls": [], "parse_errors": [],
                        "num_tool_calls": 0, "num_tool_errors": 0, "outcome_reward": outcome,
                        "reward_components": components, "ended_by": "answer"}
                return StepResult([{"role": "user", "content": "Final answer received; the episode is over."}],
                                  0.0, True, False, info)
        result = await super().astep(action)
        self._completion += [{"role": "assistant", "content": action}, *result.observation]
        return result

    async def reward(self, task: Task, state: Any) -> dict[str, float]:
        columns = {k: [v] for k, v in self._row(task).items() if k not in _NOT_COLUMNS}
        kwargs = {**columns, "prompts": [self._prompt], "completions": [self._completion],
                  "completion_ids": [[]], "environments": [self.instance], "trainer_state": None,
                  "log_extra": lambda *a, **k: None, "log_metric": lambda *a, **k: None}
        components: dict[str, float] = {}
        total = 0.0
        for fn, weight in zip(self.reward_funcs, self.reward_weights):
            values = fn(**kwargs)
            values = await values if inspect.isawaitable(values) else values
            if values is None or values[0] is None:  # not applicable to this row (TRL leaves it out)
                continue
            components[getattr(fn, "__name__", "reward_func")] = float(values[0])
            total += weight * float(values[0])
        if self.owns_reward:
            value = self.instance.get_reward()
            value = await value if inspect.isawaitable(value) else value
            components[type(self.instance).__name__] = float(value)
            total += float(value)
        return {"reward": total, **components}
