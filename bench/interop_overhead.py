"""What an adapted foreign env costs over the same env written natively (issue 53's target: <= 5% of
rollout time).

    .venv/bin/python bench/interop_overhead.py [--tasks 32] [--rounds 3] [--dataset chain_sum]

Both envs serve the same reasoning-gym items (question, answer) with the same prompts and the
same `submit` tool: `reasoning_gym:DATASET` through agentrl/interop/reasoning_gym.py, and a
hand-written ToolEnv holding the items as plain data and grading by exact match. The same
RolloutEngine over the real embedded model (hf engine, greedy) plays every task in both, in
alternating rounds, so the generations are the same tokens and the difference is the adapter's.
Prints one JSON line: rollout wall seconds per env, the env's own seconds (building it, and
areset/astep/reward: the rollout's `env_s`), and overhead = (adapted env seconds - native env
seconds) / native rollout seconds (summed over episodes), with the machine's load. The wall-clock
ratio is printed too; on a shared, loaded machine it measures the load more than the adapter.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from _common import emit, load_average, machine_info, utc_now

import agentrl
from agentrl.env import ToolEnv
from agentrl.inference.base import SamplingParams
from agentrl.inference.hf import HFEngine
from agentrl.models import load_tokenizer, resolve_model
from agentrl.rollout.engine import RolloutEngine
from agentrl.tools import state_get, submit
from agentrl.types import Task


class NativeSumEnv(ToolEnv):
    """The same task written for agentrl directly: items as data, exact-match grading."""

    tools = (submit,)
    max_turns = 2

    def __init__(self, items: list[Task], system: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.items, self.system = items, system

    def tasks(self, split: str = "train") -> list[Task]:
        return self.items

    def system_prompt(self, task: Task) -> str:
        return self.system

    def user_prompt(self, task: Task) -> str:
        return task["question"]

    async def reward(self, task: Task, state: Any) -> float:
        return float(str(state_get(state, "answer", "")).strip() == str(task["answer"]).strip())


async def play(rollout: RolloutEngine, factory: Any, tasks: list[Task]) -> dict[str, float]:
    built = [0.0]

    def timed_factory() -> Any:  # building the env is the adapter's cost too (the rollout's env_s leaves it out)
        t = time.perf_counter()
        env = factory()
        built[0] += time.perf_counter() - t
        return env

    t0 = time.perf_counter()
    trajs = [t async for t in rollout.stream(timed_factory, tasks, 1)]
    return {"wall_s": time.perf_counter() - t0, "build_s": built[0],
            "env_s": sum(t.timings.get("env_s", 0.0) for t in trajs),
            "total_s": sum(t.timings.get("total_s", 0.0) for t in trajs),
            "reward": statistics.fmean(t.reward for t in trajs), "tokens": sum(t.num_policy_tokens for t in trajs)}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    name = f"reasoning_gym:{args.dataset}"
    adapted = agentrl.make(name, num_tasks=args.tasks, num_test_tasks=1)
    tasks = list(adapted.tasks("train"))
    system = adapted.system_prompt(tasks[0])
    items = [{"id": f"native/{i}", "question": t["question"], "answer": t["answer"]} for i, t in enumerate(tasks)]
    path = resolve_model("smollm2-135m")
    engine = HFEngine(path, max_batch_size=args.concurrency)
    rollout = RolloutEngine(engine, load_tokenizer(path), SamplingParams(temperature=0.0, max_tokens=args.max_tokens),
                            concurrency=args.concurrency, max_context_tokens=2048)
    runs: dict[str, list[dict[str, float]]] = {"adapted": [], "native": []}
    try:
        await play(rollout, lambda: NativeSumEnv(items, system), items[:2])  # warm the engine up
        for r in range(args.rounds):
            order = ["adapted", "native"] if r % 2 == 0 else ["native", "adapted"]
            for kind in order:
                if kind == "adapted":
                    runs[kind].append(await play(rollout, lambda: agentrl.make(name, num_tasks=args.tasks,
                                                                                 num_test_tasks=1), tasks))
                else:
                    runs[kind].append(await play(rollout, lambda: NativeSumEnv(items, system), items))
    finally:
        await engine.close()

    def total(kind: str, key: str) -> float:
        return sum(x[key] for x in runs[kind])

    def env_cost(kind: str) -> float:
        return total(kind, "env_s") + total(kind, "build_s")

    overhead = (env_cost("adapted") - env_cost("native")) / total("native", "total_s")
    return {"bench": "interop-overhead", "time": utc_now(), "env": name, "tasks": len(tasks), "rounds": args.rounds,
            "rollout_wall_s": {k: [round(x["wall_s"], 2) for x in v] for k, v in runs.items()},
            "env_s": {k: round(total(k, "env_s"), 4) for k in runs},
            "build_s": {k: round(total(k, "build_s"), 4) for k in runs},
            "rollout_total_s": {k: round(total(k, "total_s"), 2) for k in runs},
            "overhead_of_rollout": overhead, "target": 0.05, "met": overhead <= 0.05,
            "wall_ratio": total("adapted", "wall_s") / total("native", "wall_s"),
            "same_rewards": [x["reward"] for x in runs["adapted"]] == [x["reward"] for x in runs["native"]],
            "policy_tokens": {k: [int(x["tokens"]) for x in v] for k, v in runs.items()},
            "load_before": args.load_before, "load_after": load_average(), "machine": machine_info()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="chain_sum")
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    args.load_before = load_average()
    emit(asyncio.run(measure(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
