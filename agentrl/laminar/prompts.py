"""Prompt pool: hands out whole prompt groups (Laminar §3.1 data module; algorithms.md §1.3).

All G samples of a task form one group and go to one worker. With a `balance_key` (a task field,
e.g. a question kind) the order takes turns over that field's values, so RL trains on every kind
as often as a held-out set that mixes kinds evenly asks about it, not in proportion to how many
tasks each kind has. A *quota* lets the baselines release whole batches (`sync` one at a time,
`global-async` up to two ahead of the trainer) and require a minimum weight version of the worker
that takes it; Laminar leaves the quota open.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from dataclasses import asdict
from typing import Any

from agentrl.errors import UserError
from agentrl.laminar.types import GroupSpec
from agentrl.types import Task

__all__ = ["GroupSpec", "PromptPool", "require_field", "task_without"]


def task_without(tasks: list[Task], key: str) -> Task | None:
    """The first task that lacks the field `key` (a `balance_key` every task must have), or None."""
    return next((t for t in tasks if key not in t), None)


def require_field(tasks: list[Task], key: str, setting: str, env_name: str) -> None:
    """A setting that names a task field (`rollout.balance_key`, `eval.group_by`) stops the run with
    one line, naming the fields the tasks do have, unless every task has it."""
    if (missing := task_without(tasks, key)) is not None:
        raise UserError(f"{setting} {key!r} is not a field of env '{env_name}''s task {missing.get('id')!r}",
                        fix=f"use one of its fields ({', '.join(sorted(missing))}) or {setting}=null")


class PromptPool:
    """Cycles over the tasks (reshuffled every epoch, in turns over `balance_key`'s values when
    set); regenerated groups go first."""

    def __init__(self, tasks: list[Task], group_size: int, seed: int = 0, shuffle: bool = True,
                 balance_key: str | None = None) -> None:
        if not tasks:
            raise ValueError("the prompt pool needs at least one task")
        for t in tasks:
            if not isinstance(t, dict) or "id" not in t:
                raise ValueError(f"every task must be a dict with an 'id' key, got {t!r:.80}")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if balance_key is not None and (missing := task_without(tasks, balance_key)) is not None:
            raise ValueError(f"rollout.balance_key {balance_key!r} is not a field of every task (e.g. "
                             f"{missing['id']!r}); set it to a field the env's tasks have, or null")
        self.tasks = list(tasks)
        self.group_size = group_size
        self.seed = seed
        self.shuffle = shuffle
        self.balance_key = balance_key
        self._order: list[int] = []
        self._epoch = -1
        self._pos = 0
        self._counter = 0
        self._retry: list[GroupSpec] = []
        self.quota: int | None = None  # groups that may still be handed out; None = unlimited
        self.min_version = -1
        self._changed = asyncio.Event()
        self.handed_out = 0

    def _next_task(self) -> Task:
        if self._pos >= len(self._order):
            self._epoch += 1
            self._order = self._epoch_order(random.Random(self.seed * 100003 + self._epoch))
            self._pos = 0
        task = self.tasks[self._order[self._pos]]
        self._pos += 1
        return task

    def _epoch_order(self, rng: random.Random) -> list[int]:
        """Every task once: shuffled, or with a `balance_key` one task of each value in turn (each
        value's tasks shuffled, the values in a shuffled order), a value that runs out leaving
        the turns to the others."""
        order = list(range(len(self.tasks)))
        if self.balance_key is None:
            if self.shuffle:
                rng.shuffle(order)
            return order
        by_value: dict[str, list[int]] = {}
        for i in order:
            by_value.setdefault(str(self.tasks[i][self.balance_key]), []).append(i)
        strata = [by_value[v] for v in sorted(by_value)]
        if self.shuffle:
            for stratum in strata:
                rng.shuffle(stratum)
            rng.shuffle(strata)
        return [i for turn in itertools.zip_longest(*strata) for i in turn if i is not None]

    async def take(self, n: int, worker_version: int) -> list[GroupSpec]:
        """Up to `n` groups for a worker holding `worker_version` (none if it is too old or
        the quota is spent)."""
        if worker_version < self.min_version:
            return []
        if self.quota is not None:
            n = min(n, self.quota)
        out = []
        while len(out) < n:
            if self._retry:
                out.append(self._retry.pop(0))
                continue
            task = self._next_task()
            out.append(GroupSpec(f"{task['id']}#{self._counter}", task, self.group_size))
            self._counter += 1
        if self.quota is not None:
            self.quota -= len(out)
        self.handed_out += len(out)
        return out

    async def requeue(self, spec: GroupSpec) -> GroupSpec:
        """A group lost in a fault is regenerated whole, under a fresh id (its old id is closed)."""
        again = GroupSpec(f"{spec.group_id}~r{self._counter}", spec.task, spec.size)
        self._counter += 1
        self._retry.append(again)
        if self.quota is not None:
            self.quota += 1
        self._changed.set()
        return again

    async def allow(self, n_groups: int | None, min_version: int = -1) -> None:
        """Baselines: release `n_groups` more groups (None: unlimited) for workers at
        `min_version` or newer."""
        self.quota = None if n_groups is None else (self.quota or 0) + n_groups
        self.min_version = min_version
        self._changed.set()

    async def wait_change(self, timeout_s: float) -> None:
        """Idle workers park here instead of polling hard."""
        self._changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

    async def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "pos": self._pos, "order": self._order, "counter": self._counter,
                "retry": [asdict(s) for s in self._retry], "handed_out": self.handed_out}

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        self._epoch, self._pos, self._order = state["epoch"], state["pos"], list(state["order"])
        self._counter, self.handed_out = state["counter"], state["handed_out"]
        self._retry = [GroupSpec(**s) for s in state["retry"]]
