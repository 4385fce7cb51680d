"""reasoning-gym's procedural datasets as an agentrl env: `--env reasoning_gym:NAME[+NAME...]`.

    agentrl train --env reasoning_gym:chain_sum+basic_arithmetic env.kwargs.num_tasks=2000

Each dataset item (question, answer, metadata) is one task. The train split and the held-out
"test" split are generated from different seeds, and a train item whose question is also a test
question is dropped, so no held-out question is ever trained on. The model answers by calling
`submit(answer=...)`; the reward is the dataset's own `score_answer(answer, entry)` (0..1, 1 =
correct). With `python=true` the model also gets the `python` tool in its sandbox. The known
answer doubles as a demonstration (a single `submit` call), so the supervised warm start works.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from agentrl.config import ConfigError
from agentrl.env import ToolEnv
from agentrl.interop.packages import check_known, require
from agentrl.parsing import ToolCall
from agentrl.tools import python as python_tool
from agentrl.tools import state_get, submit
from agentrl.types import Task

SPLITS = ("train", "test")
_TEST_SEED_OFFSET = 1_000_003  # the held-out split's seed: `seed` + this (a prime, far from any train seed)

_SYSTEM = ("Solve the user's problem. When you know the final answer, call the `submit` tool with just the "
           "answer as `answer` (no explanation).")
_SYSTEM_PYTHON = (" You may first run Python with the `python` tool (python3 in a sandbox; print what you "
                  "want to see).")


def dataset_names(spec: str) -> list[str]:
    """The dataset names of "NAME[+NAME...]"."""
    names = [n.strip() for n in spec.split("+")]
    if not spec.strip() or not all(names):
        raise ConfigError(f"reasoning_gym: '{spec}' names no dataset; use reasoning_gym:NAME[+NAME...], "
                          "e.g. reasoning_gym:chain_sum+basic_arithmetic")
    return names


@functools.lru_cache(maxsize=64)
def _dataset(name: str, size: int, seed: int, config_json: str) -> Any:
    """One generated dataset, shared by every env of the process (items are drawn lazily by index)."""
    rg = require("reasoning_gym", scheme="reasoning_gym")
    try:
        return rg.create_dataset(name, size=size, seed=seed, **json.loads(config_json))
    except (TypeError, ValueError, AssertionError) as e:  # a bad dataset_config entry
        raise ConfigError(f"reasoning_gym: dataset '{name}' rejects its config {config_json}: {e}") from None


class ReasoningGymEnv(ToolEnv):
    """reasoning-gym datasets, answered through `submit`, scored by `score_answer`.

    Args (`env.kwargs`):
        spec: "NAME[+NAME...]" (the part after `reasoning_gym:`)
        num_tasks: train tasks (spread evenly over the datasets)
        num_test_tasks: held-out tasks
        seed: the train split's seed; the held-out split uses seed + 1000003
        python: give the model the `python` tool (runs in the episode's sandbox)
        success_only: reward 1 for a fully correct answer (score_answer == 1) and 0 otherwise;
            the dataset's own score stays a reward component ("score"). Many datasets give partial
            credit to an answer that merely contains the right one ("19" for 9 scores 0.5), which a
            policy learns to exploit (configs/schemes/reasoning_gym.yaml turns this on)
        dataset_config: {NAME: {option: value}} passed to `reasoning_gym.create_dataset`
    and every `ToolEnv` option (max_turns, parser, sandbox_pool, ...).
    """

    max_turns = 2

    def __init__(self, spec: str, num_tasks: int = 500, num_test_tasks: int = 100, seed: int = 0,
                 python: bool = False, dataset_config: dict[str, dict[str, Any]] | None = None,
                 success_only: bool = False, **kwargs: Any) -> None:
        self.check_spec(spec)
        self.names = dataset_names(spec)
        if num_tasks < 1 or num_test_tasks < 1:
            raise ConfigError(f"reasoning_gym: num_tasks and num_test_tasks must be >= 1, got {num_tasks}, "
                              f"{num_test_tasks}")
        unknown = sorted(set(dataset_config or {}) - set(self.names))
        if unknown:
            raise ConfigError(f"reasoning_gym: dataset_config names {', '.join(unknown)}, which the env "
                              f"'{spec}' does not use")
        # Per instance, before ToolEnv reads them: the python tool needs a sandbox, submit alone does not.
        self.tools = (python_tool, submit) if python else (submit,)
        self.needs_sandbox = bool(python)
        self.use_python = bool(python)
        self.success_only = bool(success_only)
        super().__init__(**kwargs)
        self.seed, self.sizes = int(seed), {"train": int(num_tasks), "test": int(num_test_tasks)}
        self.configs = {n: json.dumps((dataset_config or {}).get(n, {}), sort_keys=True) for n in self.names}
        self._tasks: dict[str, list[Task]] = {}
        self.tasks("test")  # generate now: a bad config fails at construction, with a clear error

    @classmethod
    def check_spec(cls, spec: str) -> None:
        """Before any work: the package imports and every dataset name is known."""
        require("reasoning_gym", scheme="reasoning_gym")
        from reasoning_gym.factory import DATASETS  # the package imports lazily (an optional extra)

        for name in dataset_names(spec):
            check_known("dataset", name, DATASETS, scheme="reasoning_gym")

    def _split_seed(self, split: str) -> int:
        return self.seed if split == "train" else self.seed + _TEST_SEED_OFFSET

    def _generate(self, split: str, exclude: set[str]) -> list[Task]:
        n, k = self.sizes[split], len(self.names)
        per = -(-n // k)
        seed = self._split_seed(split)
        out: list[Task] = []
        for i in range(per):
            for name in self.names:
                item = _dataset(name, per, seed, self.configs[name])[i]
                if item["question"] in exclude:
                    continue
                out.append({"id": f"reasoning_gym/{name}/{split}/{seed}/{i}", "dataset": name,
                            "question": item["question"], "answer": item["answer"],
                            "metadata": item.get("metadata", {})})
        return out[:n]

    def tasks(self, split: str = "train") -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if split not in self._tasks:
            test = self._tasks.get("test") or self._generate("test", set())
            self._tasks["test"] = test
            if split == "train":  # disjoint from the held-out questions, not only by seed
                self._tasks["train"] = self._generate("train", {t["question"] for t in test})
        return self._tasks[split]

    def system_prompt(self, task: Task) -> str:
        return _SYSTEM + (_SYSTEM_PYTHON if self.use_python else "")

    def user_prompt(self, task: Task) -> str:
        return str(task["question"])

    async def reward(self, task: Task, state: Any) -> dict[str, float]:
        if not state_get(state, "submitted", False):
            return {"reward": 0.0, "score": 0.0, "submitted": 0.0}
        dataset = _dataset(task["dataset"], -(-self.sizes["train"] // len(self.names)),
                           self._split_seed("train"), self.configs[task["dataset"]])
        entry = {"question": task["question"], "answer": task["answer"], "metadata": task["metadata"]}
        score = float(dataset.score_answer(answer=str(state_get(state, "answer", "")), entry=entry))
        reward = float(score >= 1.0) if self.success_only else score
        return {"reward": reward, "score": score, "submitted": 1.0}

    async def demonstrate(self, task: Task) -> list[str]:
        """The dataset's own answer, submitted (teaches the format; the answer is the item's)."""
        return [self.tool_parser.format_call(ToolCall("submit", {"answer": str(task["answer"])}))]
