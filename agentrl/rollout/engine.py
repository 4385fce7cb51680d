"""The asyncio trajectory-level rollout engine (architecture.md §6).

    rollout = RolloutEngine(engine, tokenizer, SamplingParams(max_tokens=256), concurrency=16)
    group = await rollout.run_group(lambda: make("code"), task, G=8)
    async for traj in rollout.stream(env_factory, tasks, G=8): ...   # as each one finishes

One asyncio task per trajectory; a semaphore bounds how many run at once; each has a wall-clock
budget (→ `aborted`) and can be cancelled. The context is kept as token ids: the policy's own
tokens (loss mask 1, behaviour log-prob, weight version) and the chat template's tokens for
everything else (mask 0), appended by `ChatTokens` and never re-tokenized. When the chat template
rewrites earlier turns (Qwen3-style templates drop past `<think>` blocks) there is nothing to
append: the trajectory goes step-wise, each later policy request its own segment holding the
template's prompt for it and the tokens sampled under it (agentrl/rollout/stepwise.py). A failing
env ends only its own trajectory (`error`). A trajectory can be paused at a turn boundary and exported
(`RolloutState`), then resumed on another RolloutEngine: what Laminar's repack moves (§1.4).
Context management (e.g. SUPO summarisation, algorithms.md §4) is a `ContextPolicy` the env
supplies (`env.context_policy`) or the engine is given; this module only applies it.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentrl.agent_env import AgentEnv
from agentrl.inference.base import InferenceEngine, SamplingParams
from agentrl.rollout.context import ContextPolicy, context_policy_of
from agentrl.rollout.state import RolloutState, TrajectoryEnd, step_seed, trajectory_seed
from agentrl.rollout.stepwise import APPEND, STEPWISE, starts_with
from agentrl.rollout.tokens import (
    ChatTemplateError,
    ChatTokenizer,
    ChatTokens,
    HistoryRewrite,
    verify_append_only,
)
from agentrl.types import Group, Message, Segment, Status, StepResult, Task, Trajectory, Turn

log = logging.getLogger(__name__)

EnvFactory = Callable[[], Any]
ProgressHook = Callable[[str, int], Any]


@dataclass
class _Live:
    task: asyncio.Task[Trajectory | None]
    state: RolloutState
    pause: bool = False
    exported: asyncio.Future[RolloutState | None] | None = None


class RolloutEngine:
    """Runs trajectories against an InferenceEngine, token-exact, many at once.

    engine: generates (`generate(prompt_ids, sampling)`); tokenizer: the policy's tokenizer
    with its chat template. sampling.seed, when set, makes each trajectory reproducible
    (per-trajectory seeds derive from it and the trajectory id). max_context_tokens is the hard
    limit of one context; reaching it ends the trajectory `truncated`. context_policy: the
    `ContextPolicy` for an env that brings none of its own (`env.context_policy`), e.g. SUPO.
    on_progress(traj_id, tokens_so_far) is called after every generation and observation (sync
    or async) so in-flight work can be streamed. verify_template: check at start-up that the
    chat template is append-only; one that is not still runs, each turn comparing the template's
    whole rendering with the segment's tokens (a template that passes pays nothing for this).
    """

    def __init__(self, engine: InferenceEngine, tokenizer: ChatTokenizer,
                 sampling: SamplingParams | None = None, *, concurrency: int = 8,
                 trajectory_timeout_s: float = 300.0, max_context_tokens: int = 2048,
                 context_policy: ContextPolicy | None = None, on_progress: ProgressHook | None = None,
                 eos_token_ids: Sequence[int] | None = None, verify_template: bool = True) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if not trajectory_timeout_s > 0:
            raise ValueError(f"trajectory_timeout_s must be > 0, got {trajectory_timeout_s}")
        if max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be >= 2, got {max_context_tokens}")
        sampling = sampling or SamplingParams()
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be SamplingParams, got {type(sampling).__name__}")
        self.engine = engine
        self.sampling = sampling
        self.concurrency = concurrency
        self.trajectory_timeout_s = trajectory_timeout_s
        self.max_context_tokens = max_context_tokens
        if context_policy is not None and not isinstance(context_policy, ContextPolicy):
            raise TypeError(f"context_policy must implement ContextPolicy, got {type(context_policy).__name__}")
        self.context_policy = context_policy
        self.on_progress = on_progress
        eos = list(eos_token_ids or [])
        if not eos:  # the template's EOS first, then whatever else the engine stops on
            eos = [tokenizer.eos_token_id, *sorted(set(getattr(engine, "eos_ids", ())) - {tokenizer.eos_token_id})]
        self.chat = ChatTokens(tokenizer, eos)
        # A template that passes the start-up check is trusted to append: its cheap deltas (which
        # still raise HistoryRewrite on the live conversation) are used. One that fails it may
        # rewrite history or render the policy's own tokens differently, so every turn compares
        # its whole rendering with the segment and goes step-wise where they part.
        self.compare_renderings = False
        if verify_template:
            try:
                verify_append_only(tokenizer, eos_token_ids=eos)
            except ChatTemplateError as e:
                log.warning("%s. Each episode compares the template's rendering with its tokens every turn "
                            "and goes step-wise (one training row per policy request) where they part.", e)
                self.compare_renderings = True
        self._sem = asyncio.Semaphore(concurrency)
        self._live: dict[str, _Live] = {}
        self._groups = 0
        self._agents: Any = None  # the agent programs' runner (agentrl/endpoint/agent.py): the first AgentEnv makes it

    @classmethod
    def from_config(cls, engine: InferenceEngine, tokenizer: ChatTokenizer, cfg: Any,
                    **kwargs: Any) -> RolloutEngine:
        """From an `agentrl.config.Config`: sampling and rollout sections (the run seed seeds
        sampling). The summarize section is the env's: `agentrl.run.make_env` wraps the env."""
        sampling = SamplingParams(temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                                  max_tokens=cfg.sampling.max_tokens, seed=cfg.run.seed)
        return cls(engine, tokenizer, sampling, concurrency=cfg.rollout.concurrency,
                   trajectory_timeout_s=cfg.rollout.trajectory_timeout_s,
                   max_context_tokens=cfg.rollout.max_context_tokens, **kwargs)

    # ------------------------------------------------------------------ public API

    @property
    def in_flight(self) -> list[str]:
        """Ids of trajectories started here and not yet finished or exported."""
        return list(self._live)

    async def run_group(self, env_factory: EnvFactory, task: Task, G: int, *,
                        group_id: str | None = None) -> Group:
        """Run G trajectories of one task concurrently; returns them in index order.

        A trajectory exported meanwhile is absent (it finishes on the engine that resumed it)."""
        gid, starts = self._start_group(env_factory, task, G, group_id)
        done = await asyncio.gather(*starts)
        return Group(id=gid, task_id=str(task.get("id", "")), trajectories=[t for t in done if t is not None])

    async def run_groups(self, env_factory: EnvFactory, tasks: Sequence[Task], G: int) -> list[Group]:
        """Run a group for each task, all concurrently (bounded by `concurrency`)."""
        return list(await asyncio.gather(*(self.run_group(env_factory, t, G) for t in tasks)))

    async def stream(self, env_factory: EnvFactory, tasks: Sequence[Task], G: int) -> AsyncIterator[Trajectory]:
        """Yield each finished trajectory as soon as it ends (Laminar streams trajectories, not
        batches). Closing the generator early (`contextlib.aclosing`, or letting it be
        collected) cancels whatever is still running; those trajectories end `aborted`."""
        for task in tasks:  # all checked before any starts
            _check_group_args(env_factory, task, G)
        pending: set[asyncio.Future[Trajectory | None]] = set()
        for task in tasks:
            pending.update(asyncio.ensure_future(a) for a in self._start_group(env_factory, task, G, None)[1])
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    traj = fut.result()
                    if traj is not None:
                        yield traj
        finally:
            for fut in pending:
                fut.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def run_trajectory(self, env: Any, task: Task, *, traj_id: str | None = None,
                             group_id: str = "", seed: int | None = None) -> Trajectory | None:
        """Run one trajectory on a given env (closed at the end). None if it was exported."""
        traj_id = traj_id or uuid.uuid4().hex[:12]
        traj = Trajectory(id=traj_id, group_id=group_id, task_id=str(task.get("id", "")), task=dict(task))
        state = RolloutState(trajectory=traj, prompt=[], context=[],
                             seed=seed if seed is not None else trajectory_seed(self.sampling.seed, traj_id))
        return await self._launch(state, lambda: env)

    def snapshot(self, traj_id: str) -> Trajectory:
        """A copy of an in-flight trajectory as it stands (for a partial-response pool)."""
        live = self._live.get(traj_id)
        if live is None:
            raise KeyError(f"no trajectory {traj_id!r} in flight here; in flight: {sorted(self._live)}")
        return copy.deepcopy(live.state.trajectory)

    def request_export(self, traj_id: str) -> asyncio.Future[RolloutState | None]:
        """Ask a running trajectory to pause at its next turn boundary (callable from a sync
        progress hook). The future gets its RolloutState, or None if it finished first."""
        live = self._live.get(traj_id)
        if live is None:
            raise KeyError(f"no trajectory {traj_id!r} in flight here; in flight: {sorted(self._live)}")
        if live.exported is None:
            live.exported = asyncio.get_running_loop().create_future()
            live.pause = True
        return live.exported

    async def export(self, traj_id: str) -> RolloutState | None:
        """Pause a running trajectory at its next turn boundary and hand over its state (the
        live env included; it is no longer closed here). None if it finished first."""
        return await self.request_export(traj_id)

    async def resume(self, state: RolloutState, env_factory: EnvFactory | None = None) -> Trajectory | None:
        """Continue an exported trajectory here. Without a live `state.env`, the env comes from
        `env_factory` and is brought to the same state by reset + replaying `state.actions`."""
        if state.env is None and env_factory is None:
            raise ValueError("resume needs the live env in state.env or an env_factory to replay actions")
        state = copy.copy(state)

        async def env_source() -> Any:
            if state.env is not None:
                return state.env
            env = env_factory()  # type: ignore[misc]
            try:
                await env.areset(state.trajectory.task)
                for action in state.actions:
                    await env.astep(action)
            except BaseException:
                await _close(env)
                raise
            return env

        return await self._launch(state, env_source)

    def cancel(self, traj_id: str) -> bool:
        """Cancel a trajectory (it ends `aborted`); False if it is not in flight."""
        live = self._live.get(traj_id)
        if live is None:
            return False
        live.task.cancel()
        return True

    async def aclose(self) -> None:
        """Cancel everything in flight and wait for it to wind down."""
        tasks = [live.task for live in self._live.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ task management

    def _start_group(self, env_factory: EnvFactory, task: Task, G: int,
                     group_id: str | None) -> tuple[str, list[Awaitable[Trajectory | None]]]:
        _check_group_args(env_factory, task, G)
        self._groups += 1
        gid = group_id or f"{task.get('id', 'task')}-{self._groups}"
        starts = []
        for i in range(G):
            tid = f"{gid}/{i}"
            traj = Trajectory(id=tid, group_id=gid, task_id=str(task.get("id", "")), task=dict(task))
            state = RolloutState(trajectory=traj, prompt=[], context=[],
                                 seed=trajectory_seed(self.sampling.seed, tid))
            starts.append(self._launch(state, env_factory))
        return gid, starts

    async def _launch(self, state: RolloutState, env_source: Callable[[], Any]) -> Trajectory | None:
        tid = state.trajectory.id
        if tid in self._live:
            raise ValueError(f"trajectory {tid!r} is already running here")
        task = asyncio.ensure_future(self._run(state, env_source))
        self._live[tid] = _Live(task, state)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:  # our caller was cancelled: take the trajectory down too
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        finally:
            live = self._live.pop(tid, None)
            if live is not None and live.exported is not None and not live.exported.done():
                live.exported.set_result(None)  # finished before reaching a turn boundary

    async def _run(self, state: RolloutState, env_source: Callable[[], Any]) -> Trajectory | None:
        """Run (or continue) one trajectory under the concurrency bound and its wall-clock
        budget. Returns it finished, or None when it paused for export."""
        traj = state.trajectory
        paused = False
        t_queue = time.perf_counter()
        try:
            async with self._sem:
                start = time.perf_counter()
                _add(traj.timings, "queue_s", start - t_queue)
                budget = max(self.trajectory_timeout_s - traj.timings.get("total_s", 0.0), 0.0)
                body = asyncio.ensure_future(self._body(state, env_source))
                try:
                    # Not wait_for: a TimeoutError raised by env code must stay an env error.
                    await asyncio.wait({body}, timeout=budget)
                    if not body.done():
                        raise TrajectoryEnd(Status.ABORTED, f"wall-clock budget of {self.trajectory_timeout_s:g}s exceeded")
                    body.result()  # re-raises what ended the trajectory
                    paused = True  # _body returns only at a pause; every ending raises
                finally:
                    if not body.done():
                        body.cancel()
                        await asyncio.gather(body, return_exceptions=True)
                    # The ending raised above holds this frame in its traceback, and the task holds the
                    # ending: without this the trajectory's frames, state and env stay in a reference
                    # cycle until a full garbage collection (bench/controller.py, gc_cpu_s_per_1k).
                    del body
                    _add(traj.timings, "total_s", time.perf_counter() - start)
                    if not paused and state.env is not None:
                        await _close(state.env)
                        state.env = None
        except TrajectoryEnd as end:
            _finish(traj, end.status, end.reason, end.overlong)
        except asyncio.CancelledError:  # cancel(), aclose() or a cancelled consumer
            _finish(traj, Status.ABORTED, "cancelled")
        except Exception as e:  # env, tool or engine failure: this trajectory only
            log.warning("trajectory %s ends with status error: %s: %s", traj.id, type(e).__name__, e)
            log.debug("trajectory %s traceback", traj.id, exc_info=True)
            fault = getattr(e, "fault", None)  # a sandbox that died under a tool call (SandboxDead) names its kind
            if fault:
                _count_fault(traj, str(fault))
            _finish(traj, Status.ERROR, f"{type(e).__name__}: {e}")
        if paused:
            live = self._live.get(traj.id)
            if live is not None and live.exported is not None:
                if not live.exported.done():  # (cancelled when its requester was, e.g. at shutdown)
                    live.exported.set_result(state)
                return None
        return traj

    async def _body(self, state: RolloutState, env_source: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        env = env_source()
        if asyncio.iscoroutine(env):
            env = await env
        _add(state.trajectory.timings, "env_s", time.perf_counter() - t0)
        state.env = env
        await self._drive(state, env)

    # ------------------------------------------------------------------ the rollout loop

    async def _drive(self, state: RolloutState, env: Any) -> None:
        """Run turns until the trajectory ends (raises TrajectoryEnd) or a pause is requested (returns)."""
        if isinstance(env, AgentEnv):  # its program calls the model itself, through the policy endpoint
            if self._agents is None:
                self._agents = env.episode_runner(self)
            await self._agents.run(state, env)
        traj = state.trajectory
        policy = context_policy_of(env, self.context_policy)
        traj.env = traj.env or str(getattr(env, "name", type(env).__name__))
        if not traj.segments:
            messages = await self._timed_env(traj, env.areset(traj.task))
            _check_messages(messages, "areset")
            state.prompt, state.context = list(messages), list(messages)
            traj.messages = list(messages)
            self._new_segment(traj, state.context)
        live = self._live.get(traj.id)
        try:
            while not (live is not None and live.pause):  # a pause lands on a turn boundary
                if policy is not None and state.step >= policy.max_steps:
                    raise TrajectoryEnd(Status.TRUNCATED, "supo_max_steps", overlong=True)
                await self._turn(state, env, policy)
        except TrajectoryEnd as end:
            if end.status is Status.TRUNCATED and end.reason != "env":  # we cut it: let the env score it
                await self._finalize(traj, env)
            raise

    async def _finalize(self, traj: Trajectory, env: Any) -> None:
        finalize = getattr(env, "afinalize", None)
        scored = await self._timed_env(traj, finalize()) if finalize is not None else None
        if scored is not None:
            outcome, components = scored
            traj.outcome_reward = traj.reward = float(outcome)
            traj.reward_components = {k: float(v) for k, v in components.items()}

    async def _turn(self, state: RolloutState, env: Any, policy: ContextPolicy | None) -> None:
        """One policy action, one env step, and a compaction (SUPO: a summary) if the context
        grew past the policy's threshold."""
        traj = state.trajectory
        # A rollback returns here: the pair and its generation prompt (step-wise: the pair's segment).
        n_segments, before = len(traj.segments), len(traj.segments[-1].token_ids)
        limit = self.max_context_tokens if policy is None else min(self.max_context_tokens, policy.working_context)
        turn, ended_with_eos = await self._policy_turn(state, limit)
        seg = traj.segments[-1]

        t0 = time.perf_counter()
        state.actions.append(turn.action_text)
        result = await self._timed_env(traj, env.astep(turn.action_text))
        turn.env_seconds = time.perf_counter() - t0
        if not isinstance(result, StepResult):
            raise TypeError(f"env.astep must return StepResult, got {type(result).__name__}")
        _check_messages(result.observation, "astep")
        _record_step(traj, turn, result)
        if result.terminated or result.truncated:
            traj.messages.extend(result.observation)
            info = result.info or {}
            traj.outcome_reward = traj.reward = float(info.get("outcome_reward", 0.0))
            traj.reward_components = {k: float(v) for k, v in (info.get("reward_components") or {}).items()}
            raise TrajectoryEnd(Status.FINISHED if result.terminated else Status.TRUNCATED,
                       "" if result.terminated else "env")

        # The assistant turn's closing tokens, then the observation messages, as the template
        # renders them after this exact history (step-wise: none; the next request has its own prompt).
        history = state.context
        obs = self._template_tokens(traj, seg, [*history, *result.observation], generation_prompt=False,
                                    delta=lambda: self.chat.close_assistant(history, ended_with_eos)
                                    + self.chat.append_messages(history, result.observation))
        if obs is not None:
            turn.obs_start = len(seg.token_ids)
            seg.append(obs, policy=False)
            turn.obs_end = len(seg.token_ids)
        state.context.extend(result.observation)
        traj.messages.extend(result.observation)
        await self._progress(traj)

        context_len = len(seg.token_ids) if traj.mode == APPEND else len(self.chat.rendered(state.context))
        if policy is not None and context_len >= policy.threshold:
            if traj.num_summaries >= policy.max_compactions:
                raise TrajectoryEnd(Status.TRUNCATED, "supo_max_summaries", overlong=True)
            if policy.drop_last_pair:  # from the token context only: the env keeps its effects
                del traj.segments[n_segments:]
                traj.segments[-1].truncate(before)
                del state.context[len(state.context) - 1 - len(result.observation):]
            await self._compact(state, policy)
        elif context_len >= self.max_context_tokens:
            raise TrajectoryEnd(Status.TRUNCATED, "context")

    async def _compact(self, state: RolloutState, policy: ContextPolicy) -> None:
        """Append the policy's request, generate the compaction text (trained tokens; SUPO: the
        summary after v_sum), start the next segment from what the policy makes of it (SUPO:
        s_1 ⊕ continuation template ⊕ summary, algorithms.md §4.1)."""
        traj, seg = state.trajectory, state.trajectory.segments[-1]
        request = policy.compaction_request()
        extracted = None
        if request is not None:
            history = state.context
            tokens = self._template_tokens(traj, seg, [*history, request], generation_prompt=False,
                                           delta=lambda: self.chat.append_messages(history, [request]))
            if tokens is not None:
                seg.append(tokens, policy=False)
            state.context.append(request)
            traj.messages.append(request)
            turn, _ = await self._policy_turn(state, self.max_context_tokens)
            extracted = traj.segments[-1].summary = policy.extract(turn.action_text)
        traj.num_summaries += 1
        state.context = policy.next_context(state.prompt, state.context, extracted)
        traj.messages.append(state.context[-1])
        if traj.mode == APPEND:  # step-wise, the next request renders its own prompt
            self._new_segment(traj, state.context)

    def _new_segment(self, traj: Trajectory, messages: list[Message]) -> None:
        ids = self.chat.prompt(messages)
        if len(ids) >= self.max_context_tokens:
            raise TrajectoryEnd(Status.TRUNCATED, "context")
        seg = Segment(prompt_len=len(ids))
        seg.append(ids, policy=False)
        traj.segments.append(seg)

    def _template_tokens(self, traj: Trajectory, seg: Segment, messages: list[Message], *,
                         generation_prompt: bool, delta: Callable[[], list[int]]) -> list[int] | None:
        """The template's tokens that take `seg` to its rendering of `messages` (with the next
        assistant turn's opening when `generation_prompt`), or None once the template rewrote
        earlier turns: the trajectory is then step-wise for good (`traj.mode`), each later
        request its own segment (agentrl/rollout/stepwise.py).

        `delta()` computes them from the renderings before and after the new part (it raises
        HistoryRewrite when the earlier rendering is not a prefix of the later); a template that
        failed the start-up check has its whole rendering compared with the segment's tokens."""
        if traj.mode == STEPWISE:
            return None
        if self.compare_renderings:
            rendered = self.chat.rendered(messages, generation_prompt)
            if starts_with(rendered, seg.token_ids):
                return rendered[len(seg.token_ids):]
        else:
            try:
                return delta()
            except HistoryRewrite:
                pass
        traj.mode = STEPWISE
        traj.metrics["stepwise_from_turn"] = float(traj.num_turns)  # policy turns taken in append mode
        return None

    async def _policy_turn(self, state: RolloutState, limit: int) -> tuple[Turn, bool]:
        """Open an assistant turn and sample it with at most `limit` tokens of context in all.

        The turn continues the last segment, or (step-wise) opens its own segment with the
        template's whole prompt for this request. The policy's tokens go in with mask 1, their
        behaviour log-probs and weight version; the assistant message joins the context. Returns
        the Turn and whether it ended in EOS."""
        traj = state.trajectory
        seg = traj.segments[-1]
        history = state.context
        gen_prompt = self._template_tokens(traj, seg, history, generation_prompt=True,
                                           delta=lambda: self.chat.generation_prompt(history))
        if gen_prompt is None:
            gen_prompt = self.chat.rendered(history, generation_prompt=True)
            seg = Segment(prompt_len=len(gen_prompt))
        room = limit - len(seg.token_ids) - len(gen_prompt)
        if room < 1:
            raise TrajectoryEnd(Status.TRUNCATED, "context")
        seg.append(gen_prompt, policy=False)
        if seg is not traj.segments[-1]:
            traj.segments.append(seg)
        params = replace(self.sampling, max_tokens=min(self.sampling.max_tokens, room),
                         seed=step_seed(state.seed, state.step))
        state.step += 1
        t0 = time.perf_counter()
        out = await self.engine.generate(list(seg.token_ids), params)
        wall = time.perf_counter() - t0
        _add(traj.timings, "generate_s", wall)
        if out.finish_reason == "abort":
            raise TrajectoryEnd(Status.ABORTED, "the inference engine aborted the generation (engine closed?)")
        if not out.token_ids:
            raise RuntimeError("the inference engine returned no tokens")
        if traj.policy_versions - {out.version}:  # Laminar forbids mixing (algorithms.md §1.2)
            log.warning("trajectory %s mixes weight versions %s and %s", traj.id, sorted(traj.policy_versions),
                        out.version)
            _add(traj.metrics, "version_switches", 1.0)
        start = len(seg.token_ids)
        seg.append(list(out.token_ids), policy=True, logprobs=list(out.logprobs), version=out.version)
        text = self.chat.action_text(out.token_ids)
        turn = Turn(action_text=text, action_start=start, action_end=len(seg.token_ids),
                    finish_reason=out.finish_reason, generate_seconds=wall)
        seg.turns.append(turn)
        message = Message(role="assistant", content=text)
        state.context.append(message)
        traj.messages.append(message)
        await self._progress(traj)
        return turn, self.chat.ends_turn(out.token_ids)

    async def _timed_env(self, traj: Trajectory, call: Awaitable[Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return await call
        finally:
            _add(traj.timings, "env_s", time.perf_counter() - t0)

    async def _progress(self, traj: Trajectory) -> None:
        if self.on_progress is None:
            return
        try:
            r = self.on_progress(traj.id, traj.num_tokens)
            if asyncio.iscoroutine(r):
                await r
        except Exception:  # monitoring must never end a trajectory
            log.exception("on_progress hook failed for trajectory %s", traj.id)


# ---------------------------------------------------------------------- small helpers


def _add(d: dict[str, float], key: str, value: float) -> None:
    d[key] = d.get(key, 0.0) + value


def _finish(traj: Trajectory, status: Status, reason: str = "", overlong: bool = False) -> None:
    traj.status = status
    traj.overlong = traj.overlong or overlong
    if status in (Status.ERROR, Status.ABORTED):
        traj.error = reason
    elif reason:
        traj.metrics[f"truncated_{reason}"] = 1.0


def _record_step(traj: Trajectory, turn: Turn, result: StepResult) -> None:
    """Per-step reward: the sum of info["step_rewards"] components, else StepResult.reward."""
    info = result.info or {}
    comps = {k: float(v) for k, v in (info.get("step_rewards") or {}).items()}
    turn.reward_components = comps
    turn.step_reward = float(sum(comps.values())) if comps else float(result.reward)
    turn.observation = list(result.observation)
    turn.tool_calls = int(info.get("num_tool_calls", len(info.get("tool_calls") or ())))
    turn.tool_errors = int(info.get("num_tool_errors", 0))
    turn.sandbox_faults = [str(kind) for kind in info.get("sandbox_faults") or ()]
    for kind in turn.sandbox_faults:
        _count_fault(traj, kind)
    traj.step_rewards.append(turn.step_reward)


def _count_fault(traj: Trajectory, kind: str) -> None:
    """`sandbox_fault_<kind>` in the trajectory's metrics: the limits its tool calls ran into (oom,
    disk_full, pids, timeout, sandbox_dead), summed by kind in metrics.jsonl's `sandbox_faults`."""
    _add(traj.metrics, f"sandbox_fault_{kind}", 1.0)


def _check_group_args(env_factory: Any, task: Any, G: Any) -> None:
    if not isinstance(task, dict):
        raise TypeError(f"task must be a dict with an 'id', got {type(task).__name__}")
    if not isinstance(G, int) or G < 1:
        raise ValueError(f"group size G must be an int >= 1, got {G!r}")
    if not callable(env_factory):
        raise TypeError(f"env_factory must be callable (returns a fresh env), got {type(env_factory).__name__}")


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise TypeError(f"env.{where} must return a list of chat messages (dicts with 'role'), got {messages!r:.200}")


async def _close(env: Any) -> None:
    close = getattr(env, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except Exception:  # closing must not change how the trajectory ended
        log.warning("env.aclose failed", exc_info=True)
