"""Learning on the same budget: agentrl (`global-async`, `sync` and `laminar` backends) against TRL's GRPOTrainer.

    .venv/bin/python bench/learning.py [--quick] [--budget-s S] [--systems global-async,sync,laminar,trl] [--out DIR]
    .venv/bin/python bench/learning.py --multi-turn --env search,code,swe [--heldout-n N] [--heldout-samples K] [--steps N]
    .venv/bin/python bench/learning.py --multi-turn --env reasoning_gym:chain_sum,textarena:GuessTheNumber-v0

Same task, same model (the embedded SmolLM2-135M-Instruct, fp32), same wall-clock budget on this
CPU, run one system after the other:

- Task: the `code` env's procedural tasks at difficulty 0 (envs/code.py: `add(a, b)`, `is_even(n)`,
  `greet(name)`, ...), single turn: the model's reply is the submission; reward 1.0 iff the hidden
  tests pass in a fresh bubblewrap sandbox (`envs.code.run_hidden_tests`, the env's own grader).
  Why single turn: the 135M model answers with a fenced function, not the code env's Hermes
  tool calls, so the multi-turn env starts at reward 0 (no signal for GRPO); graded straight
  from its reply it passes the easy tasks about one time in eight to one in two. TRL 1.x does have multi-turn tool support in GRPOTrainer
  (`tools=` / `environment_factory=`), but it refuses SmolLM2's chat template (no tool-calling
  support in it), so TRL gets the same single-turn set-up: same messages, same grader.
- agentrl: `run_training_async` with one HF rollout worker. `global-async` (one-step-off: the batch
  for step k+1 is generated while step k trains) is what `laminar.backend: auto` resolves to with
  one local worker, so it is what `agentrl train` runs on a laptop; `sync` alternates generation and
  training; `laminar` decouples them fully (the cluster backend).
- TRL: `bench/_trl_runner.py` under its own venv (`.venv-trl`, TRL pins its own transformers);
  its reward function sends completions to `learning.py --grade-server` (this venv), which runs
  the same hidden tests the same way.

Prints one JSON line: per system the mean reward at budget/6 wall-clock checkpoints (the batches
trained in each window), the time to reach a reward level, steps and trajectories done; the
settings and their differences; the load average (the machine is shared, so figures are noisy).
Writes learning.png (reward vs wall clock) and learning.json to --out (default bench/results/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, ROOT, emit, load_average, machine_info, utc_now

from agentrl.evaluate import wilson_interval
from agentrl.models import autocast_dtype

SYSTEMS = ("global-async", "sync", "laminar", "trl")
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"

SYSTEM_PROMPT = ("You are an expert Python programmer. Write the function the user asks for. Reply with the "
                 "complete function, including its `def` line, in one ```python code block.")


@dataclass(frozen=True)
class Settings:
    """What both frameworks share (as far as each allows; see DIFFERENCES)."""

    budget_s: float = 600.0  # wall clock per system, from the first generation to the last update
    difficulty: int = 0
    num_tasks: int = 500  # procedural training tasks (difficulty 0 has 5 families)
    seed: int = 0
    group_size: int = 4  # G completions per prompt (TRL num_generations)
    prompts_per_step: int = 2  # groups per update: 8 completions per optimizer step
    max_tokens: int = 128  # per completion (TRL max_completion_length)
    temperature: float = 1.0
    lr: float = 2e-5  # constant, no warm-up, AdamW betas (0.9, 0.95), no weight decay
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO clip-higher (TRL epsilon_high)
    grad_clip: float = 1.0
    checkpoints: int = 6  # reward reported at budget/6, 2·budget/6, ...
    # Forward/backward precision of both learners (and of agentrl's engine, which follows its trainer):
    # bfloat16 autocast over fp32 master weights and Adam (TRL bf16=True), or float32 (--dtype)
    dtype: str = "float32"


DIFFERENCES = [
    "threads: agentrl's HF engine decodes on every core, except beside a learner step, where it keeps half (1 on 2) "
    "and the step trains on the rest, and on every core from the layer where the engine idles "
    "(agentrl/inference/cpu/threads.py); under sync, where they take turns, each has every core. TRL generates, "
    "then trains, on --trl-threads (default every core)",
    "generation: agentrl's HF engine (continuous batching of the 8 requests, and of the next batch beside "
    "them when an update is skipped: rollout.concurrency 16); TRL model.generate on the batch of 8 (no vLLM "
    "on this CPU), gradient checkpointing off in both",
    "precision (--dtype): both bf16 autocast over fp32 master weights and fp32 AdamW moments, or both fp32; "
    "agentrl's engine samples in its trainer's precision, TRL's model.generate runs under its Trainer's autocast",
    "agentrl: decoupled PPO (π_prox = the training forward's detached log-probs: one mini-batch) + truncated IS "
    "(cap 2) on behaviour log-probs; "
    "TRL: GRPO with one iteration per generation batch, so its ratio is 1 at the update",
    "agentrl token-mean loss over the global batch; TRL loss_type='dapo' (the same token-level normalisation)",
    "both: GRPO advantages (group mean / std), no KL (TRL beta=0), grad clip 1.0, constant LR",
    "prompt order: agentrl's prompt pool and TRL's sampler each shuffle with --seed (different orders)",
]


# ---------------------------------------------------------------------------------------------
# The task: code env procedural tasks, one turn
# ---------------------------------------------------------------------------------------------


def bench_tasks(s: Settings) -> list[dict[str, Any]]:
    from agentrl.envs.code import load_tasks

    return load_tasks("procedural", "train", s.difficulty, s.num_tasks, s.seed)


def prompt_messages(task: dict[str, Any]) -> list[dict[str, str]]:
    """The same two messages for both frameworks."""
    stub = task["prompt"].strip("\n")
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Write the Python function `{task['entry_point']}`:\n\n```python\n{stub}\n```"}]


async def grade(task: dict[str, Any], completion: str, timeout_s: float = 10.0) -> float:
    """1.0 iff the code env's hidden tests pass on `completion`, in a fresh local sandbox."""
    from agentrl.envs.code import run_hidden_tests
    from agentrl.sandboxes import make_sandbox

    sandbox = make_sandbox()
    try:
        return float((await run_hidden_tests(sandbox, task, completion, timeout_s)).passed)
    finally:
        await sandbox.close()


def one_shot_env_class() -> type:
    """`OneShotCodeEnv`: the code env's tasks and grader, one turn (defined lazily so that
    `--grade-server` and `--help` do not import gymnasium)."""
    from agentrl.env import Env
    from agentrl.types import StepResult

    class OneShotCodeEnv(Env):
        """One turn: the reply is the submission; reward 1.0 iff the hidden tests pass."""

        def __init__(self, tasks: list[dict[str, Any]]) -> None:
            super().__init__()
            self._tasks = tasks
            self.task: dict[str, Any] | None = None

        def tasks(self, split: str = "train") -> list[dict[str, Any]]:
            return self._tasks

        async def areset(self, task: dict[str, Any]) -> list[dict[str, str]]:
            self.task = task
            return prompt_messages(task)

        async def astep(self, action: str) -> StepResult:
            if self.task is None:
                raise RuntimeError("OneShotCodeEnv.astep before areset")
            reward = await grade(self.task, action)
            return StepResult([], 0.0, terminated=True,
                              info={"outcome_reward": reward, "reward_components": {"tests_passed": reward}})

    return OneShotCodeEnv


# ---------------------------------------------------------------------------------------------
# Curves: pure functions over (seconds since start, mean reward of a batch, trajectories)
# ---------------------------------------------------------------------------------------------

Point = tuple[float, float, int]


def means_at_checkpoints(points: list[Point], budget_s: float, n: int, key: str = "reward") -> list[dict[str, Any]]:
    """A per-batch mean (the reward; tokens per completion) at wall-clock checkpoints k·budget/n
    (k = 1..n): the trajectory-weighted mean, under `key`, of the batches finished in
    ((k-1)·budget/n, k·budget/n]; None where none finished."""
    if budget_s <= 0 or n < 1:
        raise ValueError(f"budget_s must be > 0 and n >= 1, got {budget_s} and {n}")
    width = budget_s / n
    out = []
    for k in range(1, n + 1):
        lo, hi = (k - 1) * width, k * width
        window = [(r, m) for t, r, m in points if lo < t <= hi or (k == n and t > hi)]  # overrun → last
        total = sum(m for _, m in window)
        out.append({"t_s": round(hi, 1), key: round(sum(r * m for r, m in window) / total, 4) if total else None,
                    "trajectories": total})
    return out


def trailing_means(points: list[Point], window: int = 3) -> list[tuple[float, float]]:
    """(time, trajectory-weighted mean reward of the last `window` batches) at each batch."""
    out = []
    for i, (t, _, _) in enumerate(points):
        recent = points[max(0, i - window + 1): i + 1]
        total = sum(m for _, _, m in recent)
        out.append((t, sum(r * m for _, r, m in recent) / total if total else 0.0))
    return out


def time_to_level(points: list[Point], level: float, window: int = 3) -> float | None:
    """First wall-clock time at which the trailing mean reward (last `window` batches) reaches
    `level`; None if it never does."""
    return next((round(t, 1) for t, r in trailing_means(points, window) if r >= level), None)


def _late(points: list[Point], budget_s: float) -> tuple[float, int]:
    """(Σ reward × trajectories, trajectories) of the batches in the last third of the budget."""
    late = [(r, m) for t, r, m in points if t > budget_s * 2 / 3]
    return sum(r * m for r, m in late), sum(m for _, m in late)


def final_reward(points: list[Point], budget_s: float) -> float | None:
    """Mean reward of the batches in the last third of the budget."""
    reward, n = _late(points, budget_s)
    return reward / n if n else None


def final_reward_ci95(points: list[Point], budget_s: float) -> list[float] | None:
    """Wilson 95% interval of the final reward (0/1 rewards: the late batches' trajectories as
    Bernoulli trials)."""
    reward, n = _late(points, budget_s)
    return [round(x, 4) for x in wilson_interval(round(reward), n)] if n else None


def steps_per_hour(points: list[Point], budget_s: float) -> float:
    """Steps (batches trained on) finished within the budget, per hour (a step in flight at the
    budget is not counted: every system is cut at the same wall clock)."""
    return per_hour([t for t, _, _ in points], budget_s)


def per_hour(times: list[float], budget_s: float) -> float:
    """Events at wall-clock `times` that finished within the budget, per hour."""
    return round(sum(1 for t in times if t <= budget_s) * 3600 / budget_s, 2)


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 3) if xs else None


def _trajectory_mean(points: list[Point]) -> float | None:
    """The mean over trajectories of per-batch means (each batch weighted by its trajectories)."""
    total = sum(m for _, _, m in points)
    return round(sum(x * m for _, x, m in points) / total, 3) if total else None


# ---------------------------------------------------------------------------------------------
# agentrl
# ---------------------------------------------------------------------------------------------


class BudgetReached(Exception):
    """Raised from on_step to end a run at its wall-clock budget."""


def agentrl_config(s: Settings, backend: str) -> Any:
    from agentrl.config import load_config

    return load_config(overrides=[
        f"laminar.backend={backend}", "laminar.num_workers=1", f"run.seed={s.seed}",
        f"rollout.group_size={s.group_size}",
        # two batches: one-step-off starts the batch after next beside the next when an update is skipped
        f"rollout.concurrency={2 * s.group_size * s.prompts_per_step}",
        "rollout.max_context_tokens=1024", "rollout.trajectory_timeout_s=600",
        f"sampling.temperature={s.temperature}", f"sampling.max_tokens={s.max_tokens}",
        f"trainer.batch_groups={s.prompts_per_step}", "trainer.steps=100000", f"trainer.lr={s.lr}",
        f"trainer.clip_low={s.clip_low}", f"trainer.clip_high={s.clip_high}", f"trainer.grad_clip={s.grad_clip}",
        f"trainer.micro_batch_size={s.group_size * s.prompts_per_step}",
        "trainer.weight_decay=0.0", "trainer.warmup_steps=0", "trainer.advantage=grpo", "trainer.loss=ppo",
        "trainer.loss_agg=token-mean", "trainer.kl_coef=0.0", "engine.max_batch_size=16",
        f"trainer.dtype={s.dtype}",  # TRL's GRPOTrainer gets the same (_trl_runner.py: bf16=True or not)
        # as TRL's gradient_checkpointing=False: at 8 rows of ~250 tokens the activations are small, and
        # the default (True, for long rows) recomputes every layer in the backward
        "trainer.activation_checkpointing=false",
    ])


async def run_agentrl(s: Settings, backend: str) -> dict[str, Any]:
    """Train with one backend until the budget; returns its points and run facts."""

    from agentrl.inference import make_engine
    from agentrl.inference.cpu.policy import learner_threads
    from agentrl.laminar.loop import run_training_async
    from agentrl.models import resolve_model
    from agentrl.trainer.learner import Learner

    cfg = agentrl_config(s, backend)
    tasks = bench_tasks(s)
    env_cls = one_shot_env_class()
    learner = Learner(resolve_model(cfg.model.name), cfg.trainer, temperature=cfg.sampling.temperature,
                      reward_cfg=cfg.reward)
    engine = make_engine(cfg)
    points: list[Point] = []
    staleness: list[float] = []
    # per batch: (t, policy tokens per trajectory, trajectories): TRL's completions/mean_length, over the run
    length_points: list[Point] = []
    # seconds a step spends per phase: waiting for whole groups (generation not hidden by overlap),
    # the update, the weight push, the barrier until the engine runs the new version
    phase_keys = {"wait": "trainer_wait_s", "learn": "learn_s", "push": "push_stall_s", "barrier": "weight_sync_s"}
    phases: dict[str, list[float]] = {name: [] for name in phase_keys}
    # A batch whose every group has one reward (all solved, say) has no advantage: agentrl skips its
    # update (the version stays), TRL still runs one (with a zero policy gradient). Such a step counts
    # in `steps_per_hour`; `signal_steps_per_hour` counts only the steps with an advantage.
    signal_times: list[float] = []
    version = learner.version
    t0 = time.perf_counter()

    def on_step(rec: dict[str, Any]) -> None:
        nonlocal version
        t = time.perf_counter() - t0
        points.append((round(t, 2), float(rec["reward_mean"]), int(rec["trajectories"])))
        staleness.append(float(rec["staleness_mean"]))
        lengths = [traj.num_policy_tokens for g in rec["batch"] for traj in g.trajectories]
        length_points.append((round(t, 2), sum(lengths) / max(len(lengths), 1), len(lengths)))
        for name, key in phase_keys.items():
            phases[name].append(float(rec[key]))
        if rec["version"] != version:  # the learner stepped: the batch had an advantage
            signal_times.append(round(t, 2))
            version = rec["version"]
        print(f"[learning] {backend} step {rec['step']} t={t:.0f}s reward={rec['reward_mean']:.3f}",
              file=sys.stderr, flush=True)
        if t >= s.budget_s:
            raise BudgetReached

    limit = s.budget_s * 2 + 600  # as for TRL: a step cannot be interrupted, so let the one in flight end
    timed_out = False
    try:
        await asyncio.wait_for(run_training_async(cfg, lambda: env_cls(tasks), tasks, learner, [engine],
                                                  on_step=on_step), timeout=limit)
    except BudgetReached:
        pass
    except TimeoutError:
        timed_out = True
    finally:
        await engine.close()
    return {"points": points, "length_points": length_points, "signal_times": signal_times,
            "wall_s": round(time.perf_counter() - t0, 1),
            "staleness_mean": _mean(staleness), "completion_tokens_mean": _trajectory_mean(length_points),
            **{f"{name}_s_mean": _mean(v) for name, v in phases.items()},
            "setup": "single-turn (agentrl Env, one turn)",
            "torch_threads": learner_threads(backend, engine.own_threads, os.cpu_count() or 1),
            # the engine's decode rate over its forward seconds, and the fixed cost its draft width weighs (per thread count)
            "engine_tokens_per_forward_s": round(engine.metrics["tokens"] / max(engine.metrics["forward_s"], 1e-9), 1),
            "forward_fixed_tokens": {threads: round(fit.fixed_tokens(), 1) for threads, fit in sorted(engine.forward_costs.items())},
            **({"timed_out_after_s": limit} if timed_out else {})}


# ---------------------------------------------------------------------------------------------
# TRL (subprocess under .venv-trl) and the grade server it calls
# ---------------------------------------------------------------------------------------------


def grade_server(s: Settings) -> None:
    """Serve grading on stdin/stdout: a JSON line {"items": [[task_id, completion], ...]} in,
    {"rewards": [...]} out. Used by bench/_trl_runner.py so TRL is graded exactly as agentrl."""
    by_id = {t["id"]: t for t in bench_tasks(s)}

    async def grade_all(items: list[list[str]]) -> list[float]:
        unknown = [tid for tid, _ in items if tid not in by_id]
        if unknown:
            raise KeyError(f"grade server: unknown task ids {unknown[:3]}")
        sem = asyncio.Semaphore(8)

        async def one(tid: str, completion: str) -> float:
            async with sem:
                return await grade(by_id[tid], completion)

        return list(await asyncio.gather(*(one(tid, c) for tid, c in items)))

    for line in sys.stdin:
        if line.strip():
            rewards = asyncio.run(grade_all(json.loads(line)["items"]))
            print(json.dumps({"rewards": rewards}), flush=True)


def run_trl(s: Settings, work: Path, threads: int) -> dict[str, Any]:
    """Run bench/_trl_runner.py under .venv-trl with `threads` torch threads; returns its points and
    run facts."""
    if not TRL_PYTHON.exists():
        raise FileNotFoundError(f"{TRL_PYTHON} not found: create it with `python3 -m venv .venv-trl && "
                                ".venv-trl/bin/pip install torch==2.13.0 trl`")
    from agentrl.models import resolve_model

    tasks = bench_tasks(s)
    data = work / "trl_tasks.jsonl"
    data.write_text("".join(json.dumps({"prompt": prompt_messages(t), "task_id": t["id"]}) + "\n" for t in tasks))
    result = work / "trl_result.json"
    grader = [sys.executable, str(Path(__file__).resolve()), "--grade-server", "--difficulty", str(s.difficulty),
              "--num-tasks", str(s.num_tasks), "--seed", str(s.seed)]
    cmd = [str(TRL_PYTHON), str(Path(__file__).resolve().parent / "_trl_runner.py"),
           "--model", str(resolve_model("smollm2-135m")), "--data", str(data), "--out", str(result),
           "--work", str(work), "--settings", json.dumps(asdict(s)), "--grader", json.dumps(grader),
           "--threads", str(threads)]
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    limit = s.budget_s * 2 + 600  # a step cannot be interrupted; allow the one in flight to end
    try:
        code = subprocess.run(cmd, env=env, timeout=limit, stdout=sys.stderr).returncode  # our stdout: one line
    except subprocess.TimeoutExpired:  # the runner saves its curve after every step: keep it
        code = None
    if not result.exists():
        why = "timed out" if code is None else f"exited with code {code}"
        raise RuntimeError(f"TRL runner {why} before its first step (its stderr is above)")
    out = json.loads(result.read_text())
    if code is None:
        out["timed_out_after_s"] = limit
    elif code != 0:
        raise RuntimeError(f"TRL runner failed with exit code {code} (its stderr is above)")
    return out


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def plot(curves: dict[str, list[Point]], budget_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in curves.items():
        if points:
            smooth = trailing_means(points)
            ax.plot([t for t, _ in smooth], [r for _, r in smooth], marker=".", label=name)
    last = max((p[0] for pts in curves.values() for p in pts), default=0.0)
    ax.set_xlim(0, max(budget_s, last) * 1.05)  # a step in flight at the budget ends after it
    ax.axvline(budget_s, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("wall clock (s)")
    ax.set_ylabel("reward (mean of last 3 batches)")
    ax.set_title("code d0 single-turn, SmolLM2-135M, same budget on CPU")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def versus_trl(systems: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Issue 17's figures: each agentrl backend's steps per hour over TRL's; the same for the steps
    whose batch carries an advantage (agentrl skips the update of any other; TRL runs it with a
    zero policy gradient), the ones that teach; and whether its final reward is not below the
    lower end of TRL's 95% interval."""
    trl = systems.get("trl")
    if not trl or not trl["steps_per_hour"]:
        return {}
    ours = {n: r for n, r in systems.items() if n != "trl"}
    low = (trl["reward_final_ci95"] or [None])[0]

    def over_trl(key: str, r: dict[str, Any]) -> float | None:
        return round(r[key] / trl[key], 2) if r.get(key) is not None and trl.get(key) else None

    return {"steps_per_hour_over_trl": {n: over_trl("steps_per_hour", r) for n, r in ours.items()},
            "signal_steps_per_hour_over_trl": {n: over_trl("signal_steps_per_hour", r) for n, r in ours.items()},
            "final_reward_not_below_trl_ci": {n: None if low is None or r["reward_final"] is None
                                              else r["reward_final"] >= low for n, r in ours.items()}}


def summarize(s: Settings, runs: dict[str, dict[str, Any]], errors: dict[str, str], load_before: Any,
              png: Path | None) -> dict[str, Any]:
    finals = {name: final_reward(r["points"], s.budget_s) for name, r in runs.items()}
    best = max((f for f in finals.values() if f is not None), default=None)
    level = round(max(0.05, 0.5 * best), 4) if best is not None else None
    systems = {}
    for name, r in runs.items():
        pts = r["points"]
        systems[name] = {
            "setup": r.get("setup"), "steps": len(pts), "trajectories": sum(m for _, _, m in pts),
            "first_step_s": pts[0][0] if pts else None, "wall_s": r.get("wall_s"),
            "reward_first_batch": pts[0][1] if pts else None,
            "reward_final": round(finals[name], 4) if finals[name] is not None else None,
            "reward_final_ci95": final_reward_ci95(pts, s.budget_s),
            "steps_per_hour": steps_per_hour(pts, s.budget_s),
            "signal_steps_per_hour": per_hour(r["signal_times"], s.budget_s) if "signal_times" in r else None,
            "reward_at": means_at_checkpoints(pts, s.budget_s, s.checkpoints),
            # tokens per completion over the run: where a policy's answers lengthen or shorten
            **({"completion_tokens_at": [{k: v for k, v in c.items() if k != "trajectories"}
                                         for c in means_at_checkpoints(r["length_points"], s.budget_s,
                                                                         s.checkpoints, key="tokens")]}
               if r.get("length_points") else {}),
            "time_to_level_s": time_to_level(pts, level) if level is not None else None,
            **({k: r[k] for k in ("staleness_mean", "wait_s_mean", "learn_s_mean", "push_s_mean", "barrier_s_mean",
                                  "step_s_mean", "completion_tokens_mean", "trl_version", "transformers_version", "torch_threads",
                                  "engine_tokens_per_forward_s", "forward_fixed_tokens",
                                  "timed_out_after_s")
                if r.get(k) is not None}),
        }
    return {
        "bench": "learning", "time": utc_now(), **versus_trl(systems), "task": f"code procedural d{s.difficulty}, single turn",
        "model": "smollm2-135m", "settings": asdict(s), "differences": DIFFERENCES,
        "level": level, "level_rule": "max(0.05, 0.5 x best final reward; final = batches in the last third)",
        "systems": systems, "errors": errors, "load_avg_before": load_before, "load_avg_after": load_average(),
        "machine": machine_info(), "plot": str(png) if png else None,
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--multi-turn" in argv:  # warm start + RL on the multi-turn envs, held-out success (bench/_multiturn.py)
        from _multiturn import main as multi_turn

        return multi_turn(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="180 s per system and 96-token completions")
    ap.add_argument("--budget-s", type=float, default=None, help="wall clock per system (default 600, quick 180)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    ap.add_argument("--lr", type=float, default=Settings.lr)
    ap.add_argument("--max-tokens", type=int, default=None, help=f"default {Settings.max_tokens} (quick 96)")
    ap.add_argument("--group-size", type=int, default=Settings.group_size)
    ap.add_argument("--prompts-per-step", type=int, default=Settings.prompts_per_step)
    ap.add_argument("--difficulty", type=int, default=Settings.difficulty)
    ap.add_argument("--num-tasks", type=int, default=Settings.num_tasks)
    ap.add_argument("--seed", type=int, default=Settings.seed)
    ap.add_argument("--trl-threads", type=int, default=os.cpu_count() or 1,
                    help="TRL's torch threads (default: every core, as each of agentrl's sync phases)")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="both learners' precision; auto: bfloat16 autocast where the CPU multiplies bf16 natively "
                         "(AVX512-BF16 or AMX, agentrl's default), else float32")
    ap.add_argument("--grade-server", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    budget = args.budget_s if args.budget_s is not None else (180.0 if args.quick else Settings.budget_s)
    if not (budget > 0 and math.isfinite(budget)):
        ap.error(f"--budget-s must be a positive number, got {budget}")
    systems = [x.strip() for x in args.systems.split(",") if x.strip()]
    bad = [x for x in systems if x not in SYSTEMS]
    if bad or not systems:
        ap.error(f"--systems: unknown {bad or 'empty list'}; choose from {', '.join(SYSTEMS)}")
    max_tokens = args.max_tokens if args.max_tokens is not None else (96 if args.quick else Settings.max_tokens)
    for flag, value, low in (("--max-tokens", max_tokens, 1), ("--group-size", args.group_size, 2),
                             ("--prompts-per-step", args.prompts_per_step, 1), ("--num-tasks", args.num_tasks, 1)):
        if value < low:
            ap.error(f"{flag} must be >= {low}, got {value}")
    if not args.lr > 0:
        ap.error(f"--lr must be > 0, got {args.lr}")
    s = Settings(budget_s=budget, lr=args.lr, max_tokens=max_tokens, difficulty=args.difficulty,
                 num_tasks=args.num_tasks, seed=args.seed, group_size=args.group_size,
                 prompts_per_step=args.prompts_per_step,
                 dtype=args.dtype if args.grade_server else autocast_dtype(args.dtype, "cpu"))  # the server needs no torch
    if args.grade_server:
        grade_server(s)
        return 0
    try:
        bench_tasks(s)  # bad difficulty / num_tasks fail here, before any model loads
    except ValueError as e:
        ap.error(str(e))

    args.out.mkdir(parents=True, exist_ok=True)
    load_before = load_average()
    runs: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-learning-") as tmp:
        for name in systems:
            print(f"[learning] {name}: {budget:.0f} s budget", file=sys.stderr, flush=True)
            try:
                runs[name] = run_trl(s, Path(tmp), args.trl_threads) if name == "trl" else asyncio.run(run_agentrl(s, name))
            except Exception as e:  # one broken system is reported, the others still run
                errors[name] = f"{type(e).__name__}: {e}"
                print(f"[learning] {name} failed: {errors[name]}", file=sys.stderr, flush=True)
    png = args.out / "learning.png"
    plot({n: r["points"] for n, r in runs.items()}, budget, png)
    record = summarize(s, runs, errors, load_before, png)
    (args.out / "learning.json").write_text(json.dumps({**record, "points": {n: r["points"] for n, r in runs.items()}},
                                                       indent=1))
    emit(record)
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
