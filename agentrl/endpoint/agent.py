"""Agent episodes for the rollout engine: an `AgentEnv`'s program runs against the policy
endpoint, and its recorded requests become the trajectory (issue 54).

The rollout engine hands an `AgentEnv` here instead of stepping it: it sits below the endpoint,
so it is handed this module's runner (`AgentEnv.runner_factory`, set by agentrl/__init__.py).
Everything around the episode (the concurrency bound, the wall-clock budget, cancellation,
Laminar's weight-version rules, progress) stays the engine's. One endpoint serves every agent episode of a rollout engine: it is
started by the first episode and stopped when the last one ends, so nothing listens between
rollouts or after the run.

How an episode ends:
- `run` returns: `finished`, with its reward; the trajectory is the requests' samples, one
  growing sequence or step-wise rows (`agentrl/rollout/stepwise.py`), `Trajectory.mode` says which;
- `run` raises: `error`, with the program's traceback in `Trajectory.error`;
- `run` never called the model: `error`, dropped (`metrics["agent_dropped"]`): nothing to train;
- a request past the context limit or `max_requests` was refused and the program gave up:
  `truncated`;
- the wall-clock budget ran out: the engine cancels the episode (`aborted`); its open requests are
  aborted here.
"""

from __future__ import annotations

import asyncio
import functools
import traceback
from typing import Any

import httpx
import openai

from agentrl.endpoint.server import Episode, PolicyEndpoint
from agentrl.env import EnvError, EpisodeOverError
from agentrl.inference.base import GenerateOutput, SamplingParams
from agentrl.rollout.state import RolloutState, TrajectoryEnd
from agentrl.rollout.stepwise import Sample, segments_from_samples
from agentrl.types import Message, Status, StepResult, Task


def episode_client(episode: Episode, timeout_s: float | None) -> openai.AsyncOpenAI:
    """The program's client: the episode's base URL and key, no retries (a refusal is an answer).
    Plain HTTP to loopback: its httpx client loads no TLS certificates (the default one's CA bundle
    costs ~0.3 s of CPU per client on a busy machine, on the rollout's event loop)."""
    return openai.AsyncOpenAI(base_url=episode.base_url, api_key=episode.key, max_retries=0,
                              http_client=httpx.AsyncClient(verify=False, timeout=httpx.Timeout(timeout_s)))


REFUSALS = {"context_length_exceeded": "context", "request_budget_exhausted": "requests"}


class AgentProgramError(RuntimeError):
    """The agent program raised: its traceback ends the episode's `error` text."""


class AgentRunner:
    """Runs AgentEnv episodes for one RolloutEngine (duck-typed: engine, chat, sampling,
    max_context_tokens, _progress)."""

    def __init__(self, rollout: Any) -> None:
        self.rollout = rollout
        self.endpoint: PolicyEndpoint | None = None
        self._users = 0
        self._lock = asyncio.Lock()
        self._reports: set[asyncio.Future[Any]] = set()

    async def _acquire(self) -> PolicyEndpoint:
        async with self._lock:
            if self.endpoint is None:
                r = self.rollout
                endpoint = PolicyEndpoint(r.engine, r.chat.tokenizer, max_context_tokens=r.max_context_tokens,
                                          sampling=r.sampling, eos_token_ids=list(r.chat.eos_token_ids),
                                          pin_sampling=True, compare_renderings=getattr(r, "compare_renderings", True))
                await endpoint.start()
                self.endpoint = endpoint
            self._users += 1
            return self.endpoint

    async def _release(self) -> None:
        async with self._lock:
            self._users -= 1
            if self._users == 0 and self.endpoint is not None:
                endpoint, self.endpoint = self.endpoint, None
                await endpoint.stop()

    async def run(self, state: RolloutState, env: Any) -> None:
        """Run the episode of `state.trajectory.task` on `env`; always ends by raising
        `TrajectoryEnd` (or an error / cancellation the engine turns into the trajectory's status)."""
        traj = state.trajectory
        traj.env = traj.env or str(getattr(env, "name", type(env).__name__))
        endpoint = await asyncio.shield(self._acquire())
        episode = endpoint.open_episode(seed=state.seed, parser=env.parser, max_requests=env.max_requests,
                                        on_sample=lambda s: self._on_sample(state, episode, s))
        client = episode_client(episode, self.rollout.trajectory_timeout_s)
        try:
            await env.open(traj.task)
            try:
                result = await env.run(traj.task, client)
            except (Exception, SystemExit) as e:  # SystemExit too: a library's exit() ends one episode
                self._build(state, episode)
                if episode.samples and (refused := _refusal(episode)):
                    raise TrajectoryEnd(Status.TRUNCATED, refused) from e
                raise AgentProgramError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}") from e
            self._build(state, episode)
            if not episode.samples:
                traj.metrics["agent_dropped"] = 1.0
                raise TrajectoryEnd(Status.ERROR, "dropped: the agent program never called the model")
            traj.outcome_reward, traj.reward_components = await env.score(traj.task, result)
            traj.reward = traj.outcome_reward
            raise TrajectoryEnd(Status.FINISHED)
        finally:
            episode.close()  # aborts whatever the program still has in flight
            await asyncio.shield(self._close(client))

    async def _close(self, client: Any) -> None:
        try:
            await client.close()
        finally:
            await self._release()

    def _on_sample(self, state: RolloutState, episode: Episode, sample: Sample) -> None:
        traj = state.trajectory
        state.step += 1
        traj.timings["generate_s"] = traj.timings.get("generate_s", 0.0) + sample.generate_seconds
        if traj.policy_versions - {sample.version}:
            traj.metrics["version_switches"] = traj.metrics.get("version_switches", 0.0) + 1.0
        self._build(state, episode)
        report = asyncio.ensure_future(self.rollout._progress(traj))
        self._reports.add(report)  # held until done (the loop keeps only weak references)
        report.add_done_callback(self._reports.discard)

    def _build(self, state: RolloutState, episode: Episode) -> None:
        """The trajectory as the samples so far make it: segments, mode, messages, step rewards."""
        traj = state.trajectory
        traj.segments, traj.mode = segments_from_samples(episode.samples)
        traj.step_rewards = [0.0] * len(episode.samples)
        traj.messages = episode.conversation.last_context
        state.actions = [s.text for s in episode.samples]


def _refusal(episode: Episode) -> str | None:
    """Why the endpoint refused one of the episode's requests, as a truncation reason."""
    return next((REFUSALS[code] for code in episode.refused if code in REFUSALS), None)


@functools.cache
def _facade_tokenizer() -> Any:
    """Any chat tokenizer renders the facade's requests; the embedded model's ships with agentrl."""
    from agentrl.models import load_tokenizer, resolve_model  # heavy lazy load: transformers

    return load_tokenizer(resolve_model("smollm2-135m"))


class _ScriptedPolicy:
    """An inference engine whose completions are the texts the Gymnasium facade's `step` is given."""

    version = 0

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = frozenset({tokenizer.eos_token_id})
        self.asks: asyncio.Queue[asyncio.Future[str]] = asyncio.Queue()

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput:
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        await self.asks.put(answer)
        ids = [*self.tokenizer.encode(await answer, add_special_tokens=False), self.tokenizer.eos_token_id]
        return GenerateOutput(ids, [0.0] * len(ids), "stop", self.version)

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        raise NotImplementedError("the facade's policy is the caller of step()")

    async def close(self) -> None:
        pass


class ProgramFacade:
    """An AgentEnv's Gymnasium facade (`reset`/`step`): the caller plays the policy. `start`
    runs the program until its first model request and returns that request's messages; each
    `step(text)` answers the pending request with `text` and returns the messages the next
    request adds, or ends the episode (terminated, the program's reward) when the program returns.
    So `agentrl env check` and any Gymnasium loop exercise the real program, tools and reward."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.task: Task | None = None
        self.program: asyncio.Future[Any] | None = None
        self.answer: asyncio.Future[str] | None = None
        self.shown: list[Message] = []
        self.endpoint: PolicyEndpoint | None = None
        self.client: Any = None

    async def start(self, task: Task) -> list[Message]:
        tokenizer = await asyncio.to_thread(_facade_tokenizer)  # loading it must not stall the loop
        self.policy = _ScriptedPolicy(tokenizer)
        self.endpoint = PolicyEndpoint(self.policy, tokenizer, max_context_tokens=1 << 30)  # type: ignore[arg-type]
        await self.endpoint.start()
        self.episode = self.endpoint.open_episode(parser=self.env.parser, max_requests=self.env.max_requests)
        self.client = episode_client(self.episode, None)
        self.task = task
        await self.env.open(task)
        self.program = asyncio.ensure_future(self.env.run(task, self.client))
        observation = await self._next()
        if observation is None:
            self._program_result()
            raise EnvError(f"{type(self.env).__name__}.run returned without calling the model")
        return observation

    async def _next(self) -> list[Message] | None:
        """The messages the program's next request adds, or None when the program returned."""
        assert self.program is not None
        ask = asyncio.ensure_future(self.policy.asks.get())
        await asyncio.wait({ask, self.program}, return_when=asyncio.FIRST_COMPLETED)
        if not ask.done():
            ask.cancel()
            return None
        self.answer = ask.result()
        context = [Message(role=m["role"], content=m["content"]) for m in self.episode.context]
        new = context[len(self.shown):] if context[: len(self.shown)] == self.shown else context
        self.shown = context
        return new

    def _program_result(self) -> Any:
        assert self.program is not None
        try:
            return self.program.result()
        except Exception as e:
            raise EnvError(f"{type(self.env).__name__}.run raised {type(e).__name__}: {e}") from e

    async def step(self, action: str) -> StepResult:
        if self.answer is None:
            raise EpisodeOverError(f"{type(self.env).__name__}: the episode is over; call reset() to start a new one")
        self.shown.append(Message(role="assistant", content=action))
        self.answer.set_result(action)
        self.answer = None
        observation = await self._next()
        if observation is not None:
            return StepResult(observation, 0.0, info={"step_rewards": {}})
        assert self.task is not None
        reward, components = await self.env.score(self.task, self._program_result())
        return StepResult([Message(role="user", content=f"The agent program returned (reward {reward:g}).")],
                          0.0, terminated=True, info={"step_rewards": {}, "outcome_reward": reward,
                                                      "reward_components": components})

    async def close(self) -> None:
        if self.program is not None and not self.program.done():
            self.program.cancel()
            await asyncio.gather(self.program, return_exceptions=True)
        if self.client is not None:
            await self.client.close()
        if self.endpoint is not None:
            await self.endpoint.stop()
