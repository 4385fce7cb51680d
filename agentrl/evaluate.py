"""`agentrl eval --env NAME --model PATH_OR_RUN --n N`: success rate with a confidence interval,
mean turns, tokens and tool calls (architecture.md §10). No training; the same rollout engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import Config, ConfigError
from agentrl.env_builder import make_env
from agentrl.inference import make_engine
from agentrl.inference.base import SamplingParams, all_cores
from agentrl.inference.cpu.memory import trim_heap
from agentrl.laminar.prompts import require_field
from agentrl.metrics import is_success
from agentrl.models import load_tokenizer, resolve_configured, use_chat_template
from agentrl.progress import status
from agentrl.rollout.engine import RolloutEngine
from agentrl.sandboxes import make_pool
from agentrl.types import Task, Trajectory


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% for z=1.96); sane at 0 and n."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference_interval(before: list[bool], after: list[bool], z: float = 1.96) -> tuple[float, float]:
    """95% CI of p_after − p_before for the same tasks evaluated twice (Newcombe 1998, "Improved
    confidence intervals for the difference between binomial proportions based on paired data",
    method 10: the Wilson limits of each margin combined with the correlation φ̂ of the 2×2 table;
    as worked in Altman et al., "Statistics with confidence", 2nd ed., p. 52).
    Narrower than the two-sample interval when outcomes are correlated, as they are on the same
    tasks; with φ̂ = 0 it is the two-sample hybrid score interval."""
    if len(before) != len(after):
        raise ValueError(f"paired outcomes need equal lengths, got {len(before)} and {len(after)}")
    n = len(before)
    if n == 0:
        return -1.0, 1.0
    both = sum(1 for b, a in zip(before, after) if a and b)
    gained = sum(1 for b, a in zip(before, after) if a and not b)
    lost = sum(1 for b, a in zip(before, after) if b and not a)
    neither = n - both - gained - lost
    p1, p2 = (both + gained) / n, (both + lost) / n  # after, before
    l1, u1 = wilson_interval(both + gained, n, z)
    l2, u2 = wilson_interval(both + lost, n, z)
    # φ̂ with Newcombe's adjustment: a positive association is shrunk by n/2 (never below 0)
    margins = (both + gained) * (lost + neither) * (both + lost) * (gained + neither)
    cross = both * neither - gained * lost
    cross = cross - n / 2 if cross > n / 2 else min(cross, 0)
    phi = cross / math.sqrt(margins) if margins else 0.0
    delta = p1 - p2
    lower = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    upper = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, delta - lower), min(1.0, delta + upper)


def task_mean_interval(rates: list[float], z: float = 1.96) -> tuple[float, float]:
    """95% CI of a mean over tasks of per-task values: mean ± z·s/√n, s the sample standard
    deviation over tasks. With k > 1 sampled episodes per task (`eval.samples`) the task is the
    unit: episodes of one task are correlated, so the n·k episodes' binomial interval would be too
    narrow (Miller 2024, "Adding Error Bars to Evals", §2.2 and §3: the central-limit interval on
    per-question means; for per-task differences it is the paired interval)."""
    n = len(rates)
    if n < 2:
        return -1.0, 1.0
    mean = sum(rates) / n
    half = z * math.sqrt(sum((r - mean) ** 2 for r in rates) / (n - 1) / n)
    return mean - half, mean + half


def task_rate_interval(rates: list[float], z: float = 1.96) -> tuple[float, float]:
    """95% CI of the mean success rate over tasks of several episodes each: `task_mean_interval`,
    clipped to [0, 1]. When every task has the same rate (all 0 before a warm start, all 1) the
    tasks show no spread and that interval no width; then Wilson's over the n tasks, whose
    binomial variance m(1 − m) bounds the variance of any rates in [0, 1] with mean m."""
    if len(set(rates)) > 1:
        lo, hi = task_mean_interval(rates, z)
        return max(0.0, lo), min(1.0, hi)
    return wilson_interval(sum(rates), len(rates), z)  # the successes may be fractional: p = m


def heldout_gain(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """The change in held-out success between two evaluation records of the same tasks, with the
    paired interval (Newcombe's for one episode per task, the mean difference's over tasks for
    several); None when the records hold no per-task outcomes for the same tasks."""
    b, a = before.get("heldout_outcomes"), after.get("heldout_outcomes")
    if not b or not a or set(b) != set(a):
        return None
    ids = sorted(b)
    kb, ka = before.get("heldout_samples", 1), after.get("heldout_samples", 1)
    rb, ra = [b[i] / kb for i in ids], [a[i] / ka for i in ids]
    if kb == ka == 1:
        lo, hi = paired_difference_interval([bool(x) for x in rb], [bool(x) for x in ra])
    else:
        lo, hi = task_mean_interval([y - x for x, y in zip(rb, ra)])
    return {"from": before["phase"], "to": after["phase"], "gain": after["heldout_success"] - before["heldout_success"],
            "ci_low": max(-1.0, lo), "ci_high": min(1.0, hi), "n": len(ids), "samples": ka,
            "gained": sum(1 for x, y in zip(rb, ra) if y > x), "lost": sum(1 for x, y in zip(rb, ra) if y < x)}


def gain_line(gain: dict[str, Any]) -> str:
    """One printed line: 'held-out gain warm_start → final: +0.094 (paired 95% CI -0.031 to +0.219;
    5 tasks gained, 2 lost, n=32)'."""
    return (f"held-out gain {gain['from']} → {gain['to']}: {gain['gain']:+.3f} (paired 95% CI "
            f"{gain['ci_low']:+.3f} to {gain['ci_high']:+.3f}; {gain['gained']} tasks gained, "
            f"{gain['lost']} lost, n={tasks_label(gain['n'], gain.get('samples', 1))})")


_STAGE_NAMES = {"base": "the base model", "warm_start": "after the warm start", "final": "the end"}


def verdict_line(records: list[dict[str, Any]]) -> str | None:
    """The run's last word: whether held-out success rose from the first evaluation (the base
    model's, else the one after the warm start) to the final one, and by how much; None without both."""
    by_phase = {r["phase"]: r for r in records}
    first, last = by_phase.get("base") or by_phase.get("warm_start"), by_phase.get("final")
    if first is None or last is None:
        return None
    change = last["heldout_success"] - first["heldout_success"]
    word = f"rose by {change:.3f}" if change > 0 else f"fell by {-change:.3f}" if change < 0 else "did not rise"
    return (f"held-out success {word}: {first['heldout_success']:.3f} ({_STAGE_NAMES[first['phase']]}) → "
            f"{last['heldout_success']:.3f} (the end), "
            f"n={tasks_label(last['heldout_n'], last.get('heldout_samples', 1))} held-out tasks")


def tasks_label(n: int, samples: int) -> str:
    """'32', or '32×4' for 32 tasks of 4 sampled episodes each."""
    return f"{n}×{samples}" if samples > 1 else str(n)


def rl_span(records: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The evaluations RL's effect lies between: the one after the warm start (the base one when
    there was no warm start) and the final one; None before a final evaluation."""
    by_phase = {r["phase"]: r for r in records}
    start = by_phase.get("warm_start") or by_phase.get("base")
    return (start, by_phase["final"]) if start and "final" in by_phase else None


def rl_gain(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What RL added on held-out tasks: `rl_span`'s two evaluations, paired over the same tasks."""
    span = rl_span(records)
    return heldout_gain(*span) if span else None


def success_by_group(outcomes: Iterable[tuple[str, int]], group_of: dict[str, str]) -> dict[str, dict[str, int]]:
    """Successes and episodes per value of a task field (`eval.group_by`), sorted by value, from
    (task id, success) pairs."""
    out: dict[str, dict[str, int]] = {}
    for task_id, ok in outcomes:
        counts = out.setdefault(group_of[task_id], {"successes": 0, "n": 0})
        counts["successes"] += int(ok)
        counts["n"] += 1
    return dict(sorted(out.items()))


def success_counts(outcomes: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Successes per task id, sorted by id, from (task id, success) pairs: a task evaluated k times
    (cycled, or `eval.samples`) counts 0..k."""
    counts: dict[str, int] = {}
    for task_id, ok in outcomes:
        counts[task_id] = counts.get(task_id, 0) + int(ok)
    return dict(sorted(counts.items()))


def groups_of(tasks: list[Task], key: str, env_name: str) -> dict[str, str]:
    """Task id -> its value of the field `eval.group_by` names; one line (UserError) when a task
    lacks the field."""
    require_field(tasks, key, "eval.group_by", env_name)
    return {str(t.get("id", "")): str(t[key]) for t in tasks}


def group_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """'country_alpha3 0/5 → 3/5' for every group whose successes differ between two evaluations
    (empty when they were not counted per group)."""
    b, a = before.get("heldout_by_group") or {}, after.get("heldout_by_group") or {}
    return [f"{g} {b[g]['successes']}/{b[g]['n']} → {a[g]['successes']}/{a[g]['n']}"
            for g in a if g in b and a[g]["successes"] != b[g]["successes"]]


@dataclass
class EvalResult:
    n: int
    successes: int
    ci_low: float
    ci_high: float
    reward_mean: float
    turns_mean: float
    tokens_mean: float
    tool_calls_mean: float
    errors: int
    valid_call_rate: float = 0.0

    @property
    def success_rate(self) -> float:
        return self.successes / self.n if self.n else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "success_rate": self.success_rate}


def summarize_trajectories(trajs: list[Trajectory]) -> EvalResult:
    n = len(trajs)
    wins = sum(is_success(t) for t in trajs)
    lo, hi = wilson_interval(wins, n)

    def mean(xs: list[float]) -> float:
        return sum(xs) / n if n else 0.0

    return EvalResult(
        n=n, successes=wins, ci_low=lo, ci_high=hi,
        reward_mean=mean([t.reward for t in trajs]),
        turns_mean=mean([t.num_turns for t in trajs]),
        tokens_mean=mean([t.num_policy_tokens for t in trajs]),
        tool_calls_mean=mean([sum(turn.tool_calls for s in t.segments for turn in s.turns) for t in trajs]),
        errors=sum(t.status.value == "error" for t in trajs), valid_call_rate=valid_call_rate(trajs))


def _valid_turn(turn: Any) -> bool:
    """A turn whose calls were all well-formed calls of known tools with valid arguments: the
    env's `valid_call` step signal when it reports one, else at least one call and no tool error."""
    if "valid_call" in turn.reward_components:
        return turn.reward_components["valid_call"] > 0
    return turn.tool_calls > 0 and turn.tool_errors == 0


def valid_call_rate(trajs: list[Trajectory]) -> float:
    """The fraction of all policy turns that made valid tool calls."""
    turns = [turn for t in trajs for s in t.segments for turn in s.turns]
    return sum(_valid_turn(turn) for turn in turns) / len(turns) if turns else 0.0


class HeldOutEvaluator:
    """Held-out evaluation inside training (issue 13): the policy's current weights on a fixed set
    of `eval.n` tasks of `eval.split`, `eval.samples` episodes each at `eval.temperature`, on an
    engine of its own. Each call returns one record (success with its 95% CI: Wilson's for one
    episode per task, `task_mean_interval` for several; mean turns, valid-call rate; successes per
    task) and appends it to `<run_dir>/eval.jsonl`."""

    def __init__(self, cfg: Config, env_factory: Any, tasks: list[Any], tokenizer: Any, engine: Any,
                 run_dir: Path | None = None, started: float | None = None) -> None:
        if not tasks:
            raise ConfigError(f"eval.split={cfg.eval.split!r}: env '{cfg.env.name}' has no tasks there")
        self.cfg, self.env_factory, self.engine = cfg, env_factory, engine
        self.tasks = [tasks[i % len(tasks)] for i in range(min(cfg.eval.n, len(tasks)))]
        self.group_of = groups_of(self.tasks, key, cfg.env.name) if (key := cfg.eval.group_by) else None
        self.sampling = SamplingParams(temperature=cfg.eval.temperature, top_p=cfg.sampling.top_p,
                                       max_tokens=cfg.sampling.max_tokens, seed=cfg.run.seed)
        self.rollout = RolloutEngine(engine, tokenizer, self.sampling,
                                     concurrency=cfg.eval.concurrency or cfg.rollout.concurrency,
                                     trajectory_timeout_s=cfg.rollout.trajectory_timeout_s,
                                     max_context_tokens=cfg.rollout.max_context_tokens)
        self.path = run_dir / "eval.jsonl" if run_dir is not None else None
        self.started = time.perf_counter() if started is None else started
        self.records: list[dict[str, Any]] = []

    @property
    def task_ids(self) -> set[str]:
        return {str(t.get("id", "")) for t in self.tasks}

    async def run(self, learner: Any, phase: str, step: int, alone: bool = False) -> dict[str, Any]:
        """Evaluate the learner's current weights; `phase` is base, warm_start, step or final.
        `alone`: nothing else computes meanwhile, so an hf engine decodes on every core."""
        t0 = time.perf_counter()
        # heavy lazy load: torch, which `agentrl report` (importing this module) does not need
        from agentrl.trainer.weights import weight_views

        # Views of the learner's weights, not a clone: the learner does not step during an
        # evaluation. An hf engine takes them as its parameters (no second copy of the weights).
        load = getattr(self.engine, "share_weights", self.engine.load_weights)
        await load(weight_views(learner), learner.version)
        trim_heap()  # the first time, the engine's own weights were just freed
        k = self.cfg.eval.samples
        trajs: list[Trajectory] = []
        status.stage = f"evaluating ({phase}): 0/{len(self.tasks) * k} episodes"
        with all_cores(self.engine) if alone else contextlib.nullcontext():
            async for traj in self.rollout.stream(self.env_factory, self.tasks, k):
                trajs.append(traj)
                status.stage = f"evaluating ({phase}): {len(trajs)}/{len(self.tasks) * k} episodes"
        res = summarize_trajectories(trajs)
        outcomes = [(t.task_id, int(is_success(t))) for t in trajs]
        # per task, so two evaluations of the same tasks can be compared pairwise
        per_task = success_counts(outcomes)
        lo, hi = (res.ci_low, res.ci_high) if k == 1 else task_rate_interval([c / k for c in per_task.values()])
        rec = {"phase": phase, "step": step, "version": learner.version, "split": self.cfg.eval.split,
               "heldout_n": len(per_task), "heldout_samples": k, "heldout_success": res.success_rate,
               "heldout_ci_low": lo, "heldout_ci_high": hi, "heldout_reward_mean": res.reward_mean,
               "heldout_turns_mean": res.turns_mean, "heldout_valid_call_rate": res.valid_call_rate,
               "heldout_errors": res.errors, "eval_s": time.perf_counter() - t0,
               "heldout_outcomes": per_task, "wall_s": time.perf_counter() - self.started}
        if self.group_of is not None:
            rec["group_by"] = self.cfg.eval.group_by
            rec["heldout_by_group"] = success_by_group(outcomes, self.group_of)
        self.records.append(rec)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        return rec


def heldout_line(rec: dict[str, Any]) -> str:
    """One printed line: 'held-out success 0.406 (95% CI 0.255–0.577, n=32), turns 2.1, valid calls 0.93'."""
    return (f"held-out success {rec['heldout_success']:.3f} (95% CI {rec['heldout_ci_low']:.3f}–"
            f"{rec['heldout_ci_high']:.3f}, n={tasks_label(rec['heldout_n'], rec.get('heldout_samples', 1))}), turns {rec['heldout_turns_mean']:.2f}, "
            f"valid calls {rec['heldout_valid_call_rate']:.2f}")


async def load_checkpoint(engine: Any, cfg: Config, checkpoint: Path) -> None:
    """A run checkpoint's policy weights into `engine` (a LoRA adapter merged into its base first);
    `agentrl eval` and `agentrl serve` of a run directory."""
    import torch  # heavy lazy load: only to read a checkpoint

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["learner"]
    weights = state["model"]
    if any(".lora_" in k for k in weights):  # a LoRA run checkpoints the adapter only
        from agentrl.trainer.learner import merged_lora_weights  # heavy lazy load: torch, peft

        weights = await asyncio.to_thread(merged_lora_weights, resolve_configured(cfg.model), cfg.trainer.lora,
                                          weights)
    await engine.load_weights(weights, int(state["version"]))


async def evaluate(cfg: Config, n: int, split: str = "test", checkpoint: Path | None = None
                   ) -> tuple[list[Trajectory], dict[str, str] | None]:
    """`agentrl eval`: the first `n` tasks of `split` (cycled; the train split when it has none),
    one episode each; returns their trajectories and, with `eval.group_by`, each task's group."""
    engine = make_engine(cfg)
    if checkpoint is not None:
        await load_checkpoint(engine, cfg, checkpoint)
    tokenizer = use_chat_template(load_tokenizer(resolve_configured(cfg.model)), cfg.model)
    pool = make_pool(cfg.sandbox, name=f"{cfg.env.name}-eval")
    await pool.start()
    try:
        probe = make_env(cfg, pool)
        tasks = list(probe.tasks(split)) or list(probe.tasks("train"))
        await probe.aclose()
        if not tasks:
            raise ConfigError(f"env '{cfg.env.name}' has no tasks")
        chosen = [tasks[i % len(tasks)] for i in range(n)]
        group_of = groups_of(chosen, key, cfg.env.name) if (key := cfg.eval.group_by) else None
        rollout = RolloutEngine(
            engine, tokenizer,
            SamplingParams(temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                           max_tokens=cfg.sampling.max_tokens, seed=cfg.run.seed),
            concurrency=cfg.eval.concurrency or cfg.rollout.concurrency,
            trajectory_timeout_s=cfg.rollout.trajectory_timeout_s,
            max_context_tokens=cfg.rollout.max_context_tokens)
        with all_cores(engine):  # the only work in this process: every core decodes
            groups = await rollout.run_groups(lambda: make_env(cfg, pool), chosen, 1)
        return [t for g in groups for t in g.trajectories], group_of
    finally:
        await pool.close()
        await engine.close()


def main(cfg: Config, checkpoint: Path | None, n: int, split: str = "test", model: str | None = None) -> int:
    """`agentrl eval`, once `plan.prepare_eval` has checked its arguments."""
    trajs, group_of = asyncio.run(evaluate(cfg, n, split, checkpoint))
    res = summarize_trajectories(trajs)
    figures = res.to_dict()
    print(f"env {cfg.env.name}  model {model or cfg.model.name}  episodes {res.n}")
    print(f"success rate  {res.success_rate:.3f}  (95% CI {res.ci_low:.3f}–{res.ci_high:.3f}, "
          f"{res.successes}/{res.n})")
    print(f"mean reward   {res.reward_mean:.3f}")
    print(f"mean turns    {res.turns_mean:.2f}")
    print(f"mean tokens   {res.tokens_mean:.1f}")
    print(f"mean tool calls {res.tool_calls_mean:.2f}  errors {res.errors}")
    print(f"valid-call rate {res.valid_call_rate:.3f}")

    outcomes = [(t.task_id, int(is_success(t))) for t in trajs]
    figures["outcomes"] = success_counts(outcomes)  # per task: paired comparisons across runs
    if group_of is not None:
        figures["by_group"] = success_by_group(outcomes, group_of)
        print(f"by {cfg.eval.group_by}: " + ", ".join(f"{g} {c['successes']}/{c['n']}" for g, c in figures["by_group"].items()))
    print(json.dumps(figures))
    return 0
