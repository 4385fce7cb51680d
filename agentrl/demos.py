"""Demonstrations played through the real env and the real rollout engine (issue 13).

    trajs = await collect_demonstrations(env_factory, tasks, tokenizer, per_task=2)

An env's `demonstrate(task)` gives an expert's actions as text. They are not tokenized on
their own: a `TeacherEngine` stands in for the inference engine and emits each action's tokens
(plus the end-of-turn token) instead of sampling, while the ordinary `RolloutEngine` runs the
episode — real env, real sandbox, real tool output, the same chat-template token deltas and loss
masks as an RL rollout. So a demonstration's `Trajectory` holds exactly the tokens the policy
would see and produce, and SFT on it trains the same positions RL does.

Recorded trajectories (`trajectories.jsonl` of an earlier run, or whole `Trajectory` dicts) are
read by `trajectories_from_jsonl`, filtered by reward (rejection-sampling fine-tuning).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.config import Config, ConfigError
from agentrl.env import call_demonstrate, env_class_demonstrates, has_demonstrations
from agentrl.inference.base import GenerateOutput, SamplingParams
from agentrl.metrics import is_success
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.tokens import ChatTokens
from agentrl.types import Message, Segment, Status, Task, Trajectory, Turn

log = logging.getLogger(__name__)


class DemonstrationError(ConfigError):
    """Demonstrations or recorded trajectories that cannot be trained on; the message is one
    line naming the problem and the fix. A ConfigError: it stops a run before any training."""


class TeacherEngine:
    """An `InferenceEngine` that emits given token sequences, one per `generate` call, instead
    of sampling (teacher forcing). Behaviour log-probs are 0 (SFT does not use them)."""

    def __init__(self, actions: Sequence[Sequence[int]], version: int = 0) -> None:
        self.actions = [list(a) for a in actions]
        self.version = version
        self.calls = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput:
        if self.calls >= len(self.actions):
            raise DemonstrationError(f"the episode went on after the demonstration's {len(self.actions)} "
                                     "action(s) without ending")
        ids = self.actions[self.calls]
        self.calls += 1
        if len(ids) > sampling.max_tokens:  # the policy could never produce it in one turn
            raise DemonstrationError(f"action {self.calls} has {len(ids)} tokens, more than the "
                                     f"{sampling.max_tokens} the turn allows (sampling.max_tokens or the "
                                     "context left)")
        return GenerateOutput(list(ids), [0.0] * len(ids), "stop", self.version)

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.version = version

    async def close(self) -> None:
        return None


async def demonstration_actions(env: Any, task: Task, seed: int = 0) -> list[str]:
    """`env.demonstrate(task)`, passing `seed=` when the env's method takes it (built-ins vary
    their path with it; a user's `demonstrate(task)` need not)."""
    actions = await call_demonstrate(env, task, seed)
    if not isinstance(actions, list) or not actions or not all(isinstance(a, str) for a in actions):
        raise DemonstrationError(f"{type(env).__name__}.demonstrate must return a non-empty list of action "
                                 f"strings, got {actions!r:.120}")
    return actions


async def play_demonstration(env_factory: Callable[[], Any], task: Task, tokenizer: Any, *, seed: int = 0,
                             max_tokens: int = 256, max_context_tokens: int = 4096,
                             timeout_s: float = 300.0, verify_template: bool = False,
                             version: int = 0) -> Trajectory:
    """Play one demonstration of `task` (variant `seed`) through a fresh env; returns the
    Trajectory whatever its ending (its status and reward tell whether the demonstration works).
    `version`: the weight version its tokens are labelled with (a guided RL group's own)."""
    env = env_factory()
    try:
        actions = await demonstration_actions(env, task, seed)
    except BaseException:
        close = getattr(env, "aclose", None)
        if close is not None:
            await close()
        raise
    teacher = TeacherEngine([], version=version)
    rollout = RolloutEngine(teacher, tokenizer, SamplingParams(max_tokens=max_tokens), concurrency=1,
                            trajectory_timeout_s=timeout_s, max_context_tokens=max_context_tokens,
                            verify_template=verify_template)
    eos = rollout.chat.eos_token_ids[0]
    teacher.actions = [[*rollout.chat.encode(a), eos] for a in actions]
    traj = await rollout.run_trajectory(env, task, traj_id=f"demo/{task.get('id', '')}/{seed}",
                                        group_id=f"demo/{task.get('id', '')}")
    assert traj is not None  # nothing exports it
    traj.metrics["demonstration"] = 1.0
    traj.metrics["demonstration_actions"] = float(len(actions))
    return traj


def demonstration_problem(traj: Trajectory) -> str | None:
    """Why a played demonstration is not an expert one (None: it reached the best reward)."""
    if traj.status is not Status.FINISHED:
        return f"ended {traj.status.value}{': ' + traj.error if traj.error else ''}"
    if not is_success(traj):
        return f"ended with reward {traj.outcome_reward:g} {traj.reward_components}, not the best reward"
    return None


async def collect_demonstrations(env_factory: Callable[[], Any], tasks: Sequence[Task], tokenizer: Any, *,
                                 per_task: int = 1, max_tokens: int = 256, max_context_tokens: int = 4096,
                                 concurrency: int = 4, timeout_s: float = 300.0,
                                 strict: bool = True) -> list[Trajectory]:
    """Play `per_task` demonstrations (seeds 0..per_task-1) of every task. strict: the first one
    that does not reach the best reward raises DemonstrationError (a broken expert would teach the
    policy to fail); otherwise such ones are dropped."""
    if per_task < 1:
        raise DemonstrationError(f"demonstrations per task must be >= 1, got {per_task}")
    probe = env_factory()
    try:
        if not has_demonstrations(probe):
            raise DemonstrationError(
                f"env {type(probe).__name__} has no demonstrations (define async demonstrate(task)); "
                "warm-start from recorded trajectories instead (trainer.warm_start.data=FILE.jsonl)")
    finally:
        close = getattr(probe, "aclose", None)
        if close is not None:
            await close()
    if not tasks:
        raise DemonstrationError("no tasks to demonstrate")
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(task: Task, seed: int) -> Trajectory:
        async with sem:
            # Each player checks the template: one that rewrites history plays step-wise rows.
            return await play_demonstration(env_factory, task, tokenizer, seed=seed, max_tokens=max_tokens,
                                            max_context_tokens=max_context_tokens, timeout_s=timeout_s,
                                            verify_template=True)

    trajs = await asyncio.gather(*(one(t, k) for t in tasks for k in range(per_task)))
    kept = []
    for traj in trajs:
        problem = demonstration_problem(traj)
        if problem is None:
            kept.append(traj)
        elif strict:
            raise DemonstrationError(f"the demonstration of task {traj.task_id} (seed "
                                     f"{traj.id.rsplit('/', 1)[-1]}) {problem}; fix the env's demonstrate()")
    return kept


# ---------------------------------------------------------------------------------------------
# Recorded trajectories (rejection-sampling fine-tuning)
# ---------------------------------------------------------------------------------------------

_READABLE_KEYS = ("messages", "reward")


def tokens_from_messages(messages: Sequence[Message], tokenizer: Any, traj_id: str = "",
                         eos_token_ids: Sequence[int] | None = None) -> Segment:
    """A transcript's tokens laid out exactly as the rollout engine lays them out: the closed
    prompt, then per assistant message the generation prompt (mask 0), its content and EOS
    (mask 1), the template's closing tokens and the following messages (mask 0)."""
    chat = ChatTokens(tokenizer, eos_token_ids)
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None or first == 0:
        raise DemonstrationError(f"trajectory {traj_id}: no assistant message after a prompt; nothing to train")
    history = [dict(m) for m in messages[:first]]
    seg = Segment(prompt_len=0)
    seg.append(chat.prompt(history), policy=False)
    seg.prompt_len = len(seg.token_ids)
    i = first
    while i < len(messages):
        msg = dict(messages[i])
        if msg.get("role") == "assistant":
            seg.append(chat.generation_prompt(history), policy=False)
            ids = [*chat.encode(str(msg.get("content", ""))), chat.eos_token_ids[0]]
            start = len(seg.token_ids)
            seg.append(ids, policy=True, logprobs=[0.0] * len(ids), version=0)
            seg.turns.append(Turn(action_text=str(msg.get("content", "")), action_start=start,
                                  action_end=len(seg.token_ids)))
            history.append(msg)
            j = i + 1
            while j < len(messages) and messages[j].get("role") != "assistant":
                j += 1
            new = [dict(m) for m in messages[i + 1:j]]
            if new and j < len(messages):  # the last action's observation is not in the context (as in the rollout)
                seg.append(chat.close_assistant(history, True) + chat.append_messages(history, new), policy=False)
                history.extend(new)
            i = j
        else:  # consecutive non-assistant messages after the prompt are rendered together above
            i += 1
    return seg


def _checked_rows(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) of every line, each checked against the two accepted schemas; the
    first bad line raises DemonstrationError naming it."""
    path = Path(path)
    if not path.is_file():
        raise DemonstrationError(f"trajectory file {path} does not exist")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path} line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DemonstrationError(f"{where} is not JSON ({e.msg}); expected one trajectory per line") from None
        if not isinstance(row, dict):
            raise DemonstrationError(f"{where} is not a JSON object; expected a trajectory per line")
        if "segments" in row:
            try:
                row = {"trajectory": Trajectory.from_dict(row)}
            except (KeyError, TypeError, ValueError) as e:
                raise DemonstrationError(f"{where}: not a Trajectory dict ({type(e).__name__}: {e})") from None
        else:
            missing = [k for k in _READABLE_KEYS if k not in row]
            if missing:
                raise DemonstrationError(f"{where} lacks {', '.join(repr(k) for k in missing)}; expected lines of "
                                         "a run's trajectories.jsonl (messages, reward, task_id) or Trajectory dicts")
            if not isinstance(row["messages"], list) or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) for m in row["messages"]):
                raise DemonstrationError(f"{where}: 'messages' must be a list of chat messages with a 'role'")
            if not isinstance(row["reward"], (int, float)) or isinstance(row["reward"], bool):
                raise DemonstrationError(f"{where}: 'reward' must be a number, got {row['reward']!r:.40}")
            if row.get("status", "finished") not in {s.value for s in Status}:
                raise DemonstrationError(f"{where}: unknown status {row['status']!r:.40}")
        rows.append((n, row))
    return rows


def check_trajectory_file(path: str | Path) -> int:
    """Check every line's schema (no tokenizer needed); returns the number of lines."""
    return len(_checked_rows(path))


def trajectories_from_jsonl(path: str | Path, tokenizer: Any, min_reward: float | None = 1.0,
                            exclude_task_ids: set[str] | None = None) -> list[Trajectory]:
    """Trajectories from a JSONL file: lines of `trajectories.jsonl` (agentrl train's readable
    transcripts: messages, reward, task_id) or whole `Trajectory.to_dict()` lines. Keeps those
    with reward >= min_reward (None: all) whose task is not in `exclude_task_ids`. A line of
    another schema raises DemonstrationError naming the line."""
    path = Path(path)
    out: list[Trajectory] = []
    for n, row in _checked_rows(path):
        if "trajectory" in row:
            traj = row["trajectory"]
        else:
            tid = str(row.get("id") or f"{path.stem}/{n}")
            traj = Trajectory(id=tid, group_id=tid, task_id=str(row.get("task_id", "")),
                              status=Status(row.get("status", "finished")), reward=float(row["reward"]),
                              outcome_reward=float(row.get("outcome_reward", row["reward"])),
                              messages=list(row["messages"]))
            if min_reward is not None and traj.reward < min_reward:
                continue
            traj.segments = [tokens_from_messages(row["messages"], tokenizer, tid)]
        if min_reward is not None and traj.reward < min_reward:
            continue
        if exclude_task_ids and traj.task_id in exclude_task_ids:
            continue
        if traj.status.trainable and traj.num_policy_tokens:
            out.append(traj)
    return out


# ---------------------------------------------------------------------------------------------
# The warm start's data (trainer.warm_start, `agentrl sft`)
# ---------------------------------------------------------------------------------------------


def check_warm_start(cfg: Config) -> None:
    """What can be checked before any work: a data file that exists, or an env with
    demonstrations. Raises ConfigError (one line)."""
    ws = cfg.trainer.warm_start
    if not ws.enabled:
        return
    if ws.data is not None:
        if not Path(ws.data).is_file():
            raise ConfigError(f"trainer.warm_start.data: no such file {ws.data} (a JSONL of trajectories, e.g. "
                              "an earlier run's trajectories.jsonl)")
        check_trajectory_file(ws.data)  # every line's schema, before the model loads
        return
    if ws.source == "rft":  # the policy's own episodes: any env
        return
    if not env_class_demonstrates(cfg.env.name):
        raise ConfigError(f"trainer.warm_start: env '{cfg.env.name}' has no demonstrations (no demonstrate()); "
                          "set trainer.warm_start.source=rft (the policy's own best episodes), "
                          "trainer.warm_start.data=FILE.jsonl or trainer.warm_start.enabled=false")


async def warm_start_data(cfg: Config, env_factory: Callable[[], Any], train_tasks: Sequence[Task],
                          tokenizer: Any, heldout_ids: set[str] | None = None) -> list[Trajectory]:
    """The warm-start trajectories: recorded ones from `warm_start.data` (filtered by reward),
    else demonstrations of the first `warm_start.tasks` train tasks. Held-out task ids are never
    included. Raises DemonstrationError (one line) when there is nothing good to train on."""
    ws = cfg.trainer.warm_start
    heldout = heldout_ids or set()
    if ws.data is not None:
        trajs = trajectories_from_jsonl(ws.data, tokenizer, ws.min_reward, exclude_task_ids=heldout)
        if not trajs:
            raise DemonstrationError(f"{ws.data}: no trajectory with reward >= {ws.min_reward} and policy tokens; "
                                     "lower trainer.warm_start.min_reward or record more trajectories")
        return trajs
    tasks = [t for t in train_tasks if str(t.get("id", "")) not in heldout][: ws.tasks]
    if not tasks:
        raise DemonstrationError(f"env '{cfg.env.name}' has no train tasks to demonstrate")
    trajs = await collect_demonstrations(
        env_factory, tasks, tokenizer, per_task=ws.per_task, max_tokens=max(cfg.sampling.max_tokens, 4096),
        max_context_tokens=cfg.rollout.max_context_tokens, concurrency=max(1, cfg.sandbox.pool_size),
        timeout_s=cfg.rollout.trajectory_timeout_s)
    # Longer than a turn may be: still worth imitating (the format), but RL will cut such turns.
    longest = max((t.action_end - t.action_start for tr in trajs for s in tr.segments for t in s.turns), default=0)
    if longest > cfg.sampling.max_tokens:
        log.warning("a demonstration action has %d tokens, more than sampling.max_tokens=%d: the policy "
                    "cannot produce it in one turn; raise sampling.max_tokens", longest, cfg.sampling.max_tokens)
    return trajs
