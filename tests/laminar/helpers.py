"""Test pieces for the Laminar pipeline: a long-tailed env, a fast fake engine and learner.

The fakes follow the real signatures (InferenceEngine, Learner); the real-component tests in
test_integration.py run the same pipeline with HFEngine and the real Learner.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import torch

from agentrl.config import Config, load_config
from agentrl.inference.base import GenerateOutput, SamplingParams
from agentrl.types import Group, Message, StepResult


class SleepyEnv:
    """A multi-turn env with injected long tails: task["turns"] steps, each tool call sleeping
    task["tool_s"] seconds. Reward: 1 if the first action is longer than 3 characters."""

    name = "sleepy"

    def __init__(self) -> None:
        self.task: dict[str, Any] = {}
        self.turn = 0
        self.first = ""

    async def areset(self, task: dict[str, Any]) -> list[Message]:
        self.task, self.turn = task, 0
        return [Message(role="system", content="You are terse."),
                Message(role="user", content=f"Say something about {task['id']}.{task.get('pad', '')}")]

    async def astep(self, action: str) -> StepResult:
        self.turn += 1
        if self.turn == 1:
            self.first = action
        await asyncio.sleep(self.task.get("tool_s", 0.0))
        done = self.turn >= self.task.get("turns", 1)
        reward = self.outcome()
        return StepResult(observation=[] if done else [Message(role="user", content=f"ok {self.turn}")],
                          terminated=done, info={"outcome_reward": reward} if done else {})


    def outcome(self) -> float:
        return 1.0 if len(self.first) > 3 else 0.0


class SpreadEnv(SleepyEnv):
    """SleepyEnv whose outcome alternates 1, 0, 1, ... over the envs made in this process. The
    members of a group are made one after another, so every group has a reward spread and every
    step trains (the learner skips a batch whose groups all have equal rewards)."""

    made = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self._outcome = float(next(SpreadEnv.made) % 2 == 0)

    def outcome(self) -> float:
        return self._outcome


def make_env() -> SleepyEnv:
    return SleepyEnv()


def make_spread_env() -> SpreadEnv:
    return SpreadEnv()


def tail_tasks(n_pairs: int = 2, long_turns: int = 8, tool_s: float = 0.15, short_pad_words: int = 0) -> list[dict]:
    """s0, L0, s1, L1, ...: with two groups per worker batch (unshuffled), every worker gets
    one short group and one long-tailed group. `short_pad_words` lengthens the short prompts so
    the batch's KV plateau is set by the short group: once it finishes, the growing tail stays
    below that plateau for its whole life and the worker remains a repack candidate, whatever
    the timing of the checks."""
    pad = " word" * short_pad_words
    out = []
    for i in range(n_pairs):
        out += [{"id": f"s{i}", "turns": 1, "tool_s": 0.0, "pad": pad},
                {"id": f"L{i}", "turns": long_turns, "tool_s": tool_s}]
    return out


class FakeEngine:
    """InferenceEngine with the real tokenizer: samples a few random word tokens per call."""

    def __init__(self, tokenizer: Any, delay_s: float = 0.002, seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self.version = 0
        self.eos_ids = (tokenizer.eos_token_id,)
        self.delay_s = delay_s
        self.rng = random.Random(seed)
        self.loaded: list[tuple[int, float]] = []  # (version, value of the probe weight)
        self.closed = False
        self.words = tokenizer.encode(" alpha beta gamma delta epsilon zeta eta theta", add_special_tokens=False)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput:
        await asyncio.sleep(self.delay_s)
        n = self.rng.randint(1, sampling.max_tokens)
        ids = [self.rng.choice(self.words) for _ in range(n)]
        return GenerateOutput(ids, [-1.0] * n, "length", self.version)

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.loaded.append((version, float(state_dict["probe"].flatten()[0])))
        self.version = version

    async def close(self) -> None:
        self.closed = True


class FakeLearner:
    """Learner-shaped: step() bumps the version; the probe weight equals the version."""

    def __init__(self, train_s: float = 0.05) -> None:
        self.version = 0
        self.train_s = train_s
        self.seen: list[list[Group]] = []
        self.threads: list[int] = []  # the intra-op threads each step ran on

    def step(self, groups: list[Group]) -> dict[str, float]:
        import time

        time.sleep(self.train_s)
        self.seen.append(groups)
        self.threads.append(torch.get_num_threads())
        self.version += 1
        return {"loss": 0.0, "version": float(self.version)}

    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        return {"probe": torch.full((4, 4), float(self.version)), "bias": torch.arange(8.0)}


def small_config(backend: str = "laminar", **over: Any) -> Config:
    overrides = [
        f"laminar.backend={backend}", "laminar.num_relays=2", "laminar.repack_interval_s=0.2",
        "rollout.group_size=2", "rollout.concurrency=4",
        "sampling.max_tokens=4", "trainer.batch_groups=2", "trainer.steps=4",
        "rollout.max_context_tokens=1024",
        "laminar.wait_timeout_s=240",  # a worker that cannot start fails the test, not pytest's timeout
    ] + [f"{k}={v}" for k, v in over.items()]
    return load_config(overrides=overrides)


def check_single_version(groups: list[Group]) -> None:
    for g in groups:
        assert g.version is not None
        for t in g.trajectories:
            assert t.version == g.version, (t.id, t.policy_versions)
            assert t.policy_versions == {g.version}


def fake_engine(seed: int = 0) -> FakeEngine:
    """A FakeEngine built where it runs (a Ray actor builds its own)."""
    from agentrl.models import load_tokenizer, resolve_model

    return FakeEngine(load_tokenizer(resolve_model("smollm2-135m")), seed=seed)


def kill_first_busy_worker(system: Any, kill: Any, killed: dict[str, Any]) -> Any:
    """A step callback that, once, kills the first worker holding trajectories (`kill(handle)`:
    task cancel locally, `ray.kill` on Ray) and records its name and the ids it lost."""

    async def on_step(rec: dict[str, Any]) -> None:
        if killed:
            return
        for name, w in system.workers.items():
            if (await w.load()).n_reqs > 0:
                killed["name"] = name
                killed["lost"] = [e.traj_id for e in await system.partial.of_worker(name)]
                await kill(w)
                return

    return on_step


# -- the process table, for the chaos tests (Linux /proc) ----------------------------------------

CHAOS_TAG = "AGENTRL_CHAOS_TAG"  # set in a run's environment: every process it starts inherits it


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every live, non-zombie process."""
    import os

    from agentrl.laminar.runtime import proc_stat

    out = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        fields = proc_stat(name)
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if fields is not None:
            out[int(name)] = (int(fields[1]), cmd)
    return out


def tagged_pids(tag: str) -> dict[int, str]:
    """The live processes (other than this one) started with CHAOS_TAG=tag in their environment:
    Ray's GCS, raylet, agents and workers inherit it from the driver."""
    import os

    mark = f"{CHAOS_TAG}={tag}".encode()
    out = {}
    for pid, (_, cmd) in process_table().items():
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    out[pid] = cmd
        except OSError:
            continue
    return out


def bwrap_under(roots: set[int], table: dict[int, tuple[int, str]] | None = None) -> set[int]:
    """The bubblewrap sandboxes among the descendants of `roots` (bwrap clears its environment,
    so it is found by ancestry, not by tag)."""
    table = process_table() if table is None else table
    found: set[int] = set()
    for pid, (_, cmd) in table.items():
        if not cmd.startswith("bwrap"):
            continue
        p = pid
        while p in table and p > 1:
            p = table[p][0]
            if p in roots:
                found.add(pid)
                break
    return found


def still_alive(pids: set[int], snapshot: dict[int, tuple[int, str]]) -> set[int]:
    """Those of `pids` that still run the command they ran in `snapshot` (a reused pid does not count)."""
    now = process_table()
    return {p for p in pids if p in now and now[p][1] == snapshot[p][1]}


def descendants(roots: set[int], table: dict[int, tuple[int, str]] | None = None) -> set[int]:
    """Every live descendant of `roots` (Ray's `setproctitle` overwrites the environment area of
    many of its processes, so a tag there is not enough: the process tree finds them all)."""
    table = process_table() if table is None else table
    found: set[int] = set()
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _) in table.items():
            if (ppid in roots or ppid in found) and pid not in found and pid not in roots:
                found.add(pid)
                grew = True
    return found
