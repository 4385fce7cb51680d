"""`AgentEnv`: train an agent program written against the OpenAI API, as it is (issue 54).

    class Solver(agentrl.AgentEnv):
        def tasks(self, split="train"):
            return [{"id": "t1", "question": "What is 2 + 3?", "answer": "5"}]

        async def run(self, task, client):          # client: openai.AsyncOpenAI pointed at agentrl
            reply = await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": task["question"]}])
            return float(task["answer"] in (reply.choices[0].message.content or ""))

    agentrl train --env my_module:Solver

Whatever the program does with `client` is the episode: every completion it asks for is sampled
by the policy being trained and recorded token for token (agentrl/endpoint/agent.py runs it; the
policy endpoint, agentrl/endpoint/, serves it). The reward is what `run` returns (a float, or a
dict with "reward" and named components), or what `reward(task, result)` makes of it. Tools the
program runs itself may use the episode's sandbox, `self.sandbox`, when `needs_sandbox` is set.

Budgets: the run's `rollout.trajectory_timeout_s` (the episode is cancelled, its open requests
aborted) and `max_requests` model requests per episode (a request past it is refused and the
episode ends `truncated`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

from agentrl.env import Env, EnvError, EpisodeOverError, ToolEnv, _short
from agentrl.types import Message, StepResult, Task


class AgentEnv(Env):
    """An env whose episode is an agent program: implement `tasks(split)` and
    `async run(task, client)`; optionally `reward(task, result)`.

    parser           how tool calls in the policy's text are read when a request passes `tools`
    max_requests     model requests an episode may make
    needs_sandbox    give each episode a sandbox (`self.sandbox`) from `sandbox_pool` or a private pool
    """

    parser: str = "hermes"
    max_requests: int = 64
    needs_sandbox: bool = False
    sandbox_config: Any = None
    # The program runs against the policy endpoint, which sits above this layer and the rollout
    # engine (agentrl/endpoint/agent.py, the serve extra): the package root (agentrl/__init__.py)
    # hands in what drives it, so neither the env API nor the engine imports it.
    runner_factory: ClassVar[Callable[[Any], Any] | None] = None  # RolloutEngine -> its episode runner
    facade_factory: ClassVar[Callable[[AgentEnv], Any] | None] = None  # env -> its Gymnasium facade

    def __init__(self, *, sandbox_pool: Any = None, sandbox_config: Any = None, parser: str | None = None,
                 max_requests: int | None = None, split: str = "train") -> None:
        super().__init__(split=split)
        self.parser = parser or self.parser
        self.max_requests = self.max_requests if max_requests is None else max_requests
        if not isinstance(self.max_requests, int) or self.max_requests < 1:
            raise ValueError(f"{type(self).__name__}.max_requests must be an int >= 1, got {self.max_requests!r}")
        self.sandbox_pool = sandbox_pool
        self.sandbox_config = sandbox_config if sandbox_config is not None else self.sandbox_config
        self._private_pool: Any = None
        self._sandbox_source: Any = None
        self.sandbox: Any = None
        self.task: Task | None = None
        self._facade: Any = None

    # -- what the user writes -------------------------------------------------------------------

    async def run(self, task: Task, client: Any) -> Any:
        """The agent program: call the model through `client` (an `openai.AsyncOpenAI`), return
        the reward (or what `reward` scores)."""
        raise NotImplementedError(f"{type(self).__name__} must implement async run(task, client)")

    async def reward(self, task: Task, result: Any) -> float | dict[str, float]:
        """The outcome reward from what `run` returned (default: `run`'s return value itself)."""
        return result

    # -- the episode's resources (the rollout's agent runner calls these) ----------------------

    def episode_runner(self, rollout: Any) -> Any:
        """The runner of a rollout engine's agent episodes (its `run(state, env)`)."""
        return _wired(type(self).runner_factory, "runner_factory")(rollout)

    get_pool = ToolEnv.get_pool  # the same sandbox source as a ToolEnv's: the shared pool or a private one
    _release_sandbox = ToolEnv._release_sandbox

    async def open(self, task: Task) -> None:
        """Start an episode on `task`: its sandbox, when the env needs one."""
        if not isinstance(task, dict) or "id" not in task:
            raise ValueError(f"a task must be a dict with an 'id' key, got {_short(task)}")
        await self._release_sandbox()
        self.task = task
        if self.needs_sandbox:
            pool = await self.get_pool()
            self.sandbox = await pool.get()
            self._sandbox_source = pool

    async def score(self, task: Task, result: Any) -> tuple[float, dict[str, float]]:
        """(outcome reward, components) from `run`'s result through `reward`."""
        try:
            value = await self.reward(task, result)
        except Exception as e:
            raise EnvError(f"{type(self).__name__}.reward raised {type(e).__name__}: {e}") from e
        components = value if isinstance(value, dict) else {"reward": value}
        if "reward" not in components:
            raise EnvError(f"{type(self).__name__}: a reward dict needs a 'reward' key, got {_short(value)}")
        try:
            components = {str(k): float(v) for k, v in components.items()}
        except (TypeError, ValueError):
            raise EnvError(f"{type(self).__name__}.run/reward must give a number (or a dict of numbers) as the "
                           f"reward, got {_short(value)}") from None
        if not math.isfinite(components["reward"]):
            raise EnvError(f"{type(self).__name__}: the reward is not finite ({components['reward']})")
        return components["reward"], components

    async def aclose(self) -> None:
        await self._end_facade()
        await self._release_sandbox()
        pool, self._private_pool = self._private_pool, None
        if pool is not None:
            await pool.close()

    # -- the Gymnasium facade: the caller plays the policy (agentrl/endpoint/agent.py::ProgramFacade) --

    async def areset(self, task: Task) -> list[Message]:
        """Run the program on `task` until its first model request; return that request's messages."""
        await self._end_facade()
        self._facade = _wired(type(self).facade_factory, "facade_factory")(self)
        return await self._facade.start(task)

    async def astep(self, action: str) -> StepResult:
        """Answer the program's pending request with `action`: the next request's new messages, or
        the end of the episode with the program's reward."""
        if self._facade is None:
            raise EpisodeOverError(f"{type(self).__name__}: call reset() before step()")
        return await self._facade.step(action)

    async def _end_facade(self) -> None:
        facade, self._facade = self._facade, None
        if facade is not None:
            await facade.close()


def _wired(factory: Any, name: str) -> Any:
    if factory is None:  # importing agentrl sets it: only a half-imported package gets here
        raise RuntimeError(f"AgentEnv.{name} is not set: import agentrl (agentrl/__init__.py wires agent programs)")
    return factory


class EnvAgent(AgentEnv):
    """An agentrl `Env` played as an agent program: the program resets the env, sends its
    conversation to the model through the client, steps the env with each reply and returns the
    outcome reward. The same workload as the env itself through the rollout engine, which is what
    the endpoint's token-exactness test and bench/rollout.py's agent arm compare.

        EnvAgent(env_factory=lambda: make("code"))
    """

    def __init__(self, env_factory: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not callable(env_factory):
            raise TypeError(f"EnvAgent needs env_factory, a callable that builds an Env; got {_short(env_factory)}")
        self.env_factory = env_factory
        self.requests: list[list[Message]] = []  # the conversation sent with each request

    def tasks(self, split: str = "train") -> Any:
        return self.env_factory().tasks(split)

    async def run(self, task: Task, client: Any) -> float:
        env = self.env_factory()
        try:
            messages = list(await env.areset(task))
            while True:
                self.requests.append(list(messages))
                reply = await client.chat.completions.create(model="policy", messages=messages)
                text = reply.choices[0].message.content or ""
                result = await env.astep(text)
                messages += [Message(role="assistant", content=text), *result.observation]
                if result.terminated or result.truncated:
                    return float(result.info.get("outcome_reward", 0.0))
        finally:
            await env.aclose()
