"""`bench/learning.py --multi-turn --env {search,code,swe}`: does an agent get better at a
multi-turn tool task? (issue 13) A foreign env works the same (issue 53, docs/interop.md):
`--env reasoning_gym:chain_sum` warm-starts on its demonstrations, `--env textarena:GuessTheNumber-v0`
(no demonstrations) on the policy's own best episodes (trainer.warm_start.source=rft).

Per env, one `agentrl train` run on the env's default config (configs/<env>.yaml: warm start on
demonstrations of the train split, then RL) with held-out evaluation on the test split at base,
after the warm start and at the end. Prints one JSON line per env:

    env, heldout_base, heldout_warm, heldout_rl (success rates) and their Wilson 95% CIs,
    rl_gain (heldout_rl − heldout_warm) and rl_gain_ci95 (Newcombe's interval for paired outcomes
    on the same tasks; with --heldout-samples K > 1 the interval of the mean per-task difference;
    the two-sample one when eval.jsonl has no per-task outcomes, see rl_gain_ci_kind),
    stage wall-clocks (base eval, demonstrations, SFT, RL incl. its evals), SFT tokens/s,
    sft_tokens_per_s_over_trl (TRL SFTTrainer on the same token sequences under .venv-trl, else
    null with the reason), train_reward_mean per RL step (null: skipped), the leak check (no
    held-out task id in the warm-start data) and the load average before and after.

With `--seeds K` (K > 1) each env runs K times with `run.seed=0..K-1`, which changes RL's rollout
sampling and prompt order (the seeded warm start and the greedy evaluations repeat; TRL's SFT
comparison runs on the first seed only). A last line per env pools them: the K gains with a
Student-t 95% CI over seeds (training-run spread on these tasks), and the per-task gain averaged
over seeds with a t CI over tasks (task spread, seeds pooled). One run's paired CI on ~50 tasks
is wide (±0.11); the pooled ones say whether RL's gain is a property of the recipe or of one run.

With `--heldout-samples K` (K > 1) every held-out evaluation runs K episodes of each task at the
env's sampling temperature (`eval.samples`, avg@K): the policy as RL samples it, and RL's gain paired
per task over K draws each, a more sensitive test than one greedy episode a task.

Options: --heldout-n N (held-out tasks), --heldout-samples K, --steps N (RL steps), --seeds K,
extra key=value overrides.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, emit, load_average, utc_now

TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"


def newcombe_diff_ci(p1: float, n1: int, p2: float, n2: int) -> tuple[float, float]:
    """95% CI of p1 − p2 for two independent samples (Newcombe 1998, method 10: hybrid Wilson
    score); the fallback when the evaluations hold no per-task outcomes to pair."""
    from agentrl.evaluate import wilson_interval

    l1, u1 = wilson_interval(round(p1 * n1), n1)
    l2, u2 = wilson_interval(round(p2 * n2), n2)
    d = p1 - p2
    lo = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    hi = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return max(-1.0, lo), min(1.0, hi)


# Student's t 0.975 quantiles by degrees of freedom (two-sided 95%); beyond 30 the normal's 1.96 is
# within 4%.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]


def mean_t_ci95(xs: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t 95% interval of the mean of `xs` (at least 2 values)."""
    n = len(xs)
    if n < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {n}")
    mean = statistics.fmean(xs)
    half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * statistics.stdev(xs) / math.sqrt(n)
    return mean, mean - half, mean + half


def pool_seeds(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One env's runs under several seeds, pooled: RL's gain per seed with a t CI over seeds, and
    the per-task gain (final − warm outcome, averaged over seeds) with a t CI over tasks. Records
    carry `_outcomes` ({phase: {task_id: success rate}}) from `run_env`."""
    gains = [r["rl_gain"] for r in records if r.get("rl_gain") is not None]
    out: dict[str, Any] = {"bench": "learning-multi-turn-seeds", "env": records[0]["env"], "seeds": len(records),
                           "rl_gains": gains, "heldout_rl": [r.get("heldout_rl") for r in records],
                           "heldout_warm": [r.get("heldout_warm") for r in records],
                           "wall_s": [round(r["wall_s"]["total"], 1) for r in records]}
    if len(gains) >= 2:
        mean, lo, hi = mean_t_ci95(gains)
        out.update(rl_gain_mean=mean, rl_gain_seeds_ci95=[lo, hi])
    paired = [r["_outcomes"] for r in records if {"warm_start", "final"} <= set(r.get("_outcomes", {}))]
    tasks = sorted(set.intersection(*(set(o["warm_start"]) & set(o["final"]) for o in paired))) if paired else []
    if len(tasks) >= 2:
        per_task = [sum(o["final"][t] - o["warm_start"][t] for o in paired) / len(paired) for t in tasks]
        _, lo, hi = mean_t_ci95(per_task)
        out.update(rl_gain_tasks_ci95=[lo, hi], tasks=len(tasks))
    return out


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def trl_sft_ratio(run_dir: Path, agentrl_tokens_per_s: float | None, dtype: str) -> tuple[float | None, str | None]:
    """TRL SFTTrainer's tokens/s on the warm start's own token sequences in the warm start's precision
    (`dtype`: the learner's resolved autocast dtype), as agentrl/TRL."""
    if agentrl_tokens_per_s is None:
        return None, "no warm start ran"
    if not TRL_PYTHON.exists():
        return None, f"{TRL_PYTHON} not found (python3 -m venv .venv-trl && .venv-trl/bin/pip install torch trl)"
    from agentrl.models import resolve_model

    data = run_dir / "sft_sequences.jsonl"
    if not data.exists():
        return None, "the run wrote no sft_sequences.jsonl"
    out = run_dir / "trl_sft.json"
    cmd = [str(TRL_PYTHON), str(Path(__file__).resolve().parent / "_trl_sft_runner.py"), "--model",
           str(resolve_model("smollm2-135m")), "--data", str(data), "--out", str(out), *(["--bf16"] if dtype == "bfloat16" else [])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    code = subprocess.run(cmd, env=env, stdout=sys.stderr, timeout=1800).returncode
    if code != 0 or not out.exists():
        return None, f"TRL SFT runner exited with code {code}"
    trl = json.loads(out.read_text())["tokens_per_s"]
    return agentrl_tokens_per_s / trl if trl else None, None


def run_env(env: str, heldout_n: int, steps: int | None, overrides: list[str], keep: Path | None,
            compare_trl: bool = True, heldout_samples: int = 1) -> dict[str, Any]:
    from agentrl.config import load_config
    from agentrl.env import env_class_demonstrates
    from agentrl.evaluate import rl_gain
    from agentrl.plan import prepare_run
    from agentrl.run import train
    from agentrl.trainer.learner import autocast_dtype

    if heldout_samples > 1:  # avg@K at the temperature RL samples at (an override of eval.temperature wins)
        sampling_t = load_config(env=env, overrides=overrides).sampling.temperature
        overrides = [f"eval.samples={heldout_samples}", f"eval.temperature={sampling_t}", *overrides]
    load_before = load_average()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", env)  # a foreign env's name holds ':' and '+'
    # an env without demonstrations warm-starts on the policy's own best episodes (agentrl/rft.py)
    source = [] if env_class_demonstrates(env) else ["trainer.warm_start.source=rft"]
    with tempfile.TemporaryDirectory(prefix=f"agentrl-bench-mt-{slug}-") as tmp:
        root = keep or Path(tmp)
        extra = [f"run.dir={root}", f"run.name={slug}", "run.quiet=true", "eval.enabled=true", f"eval.n={heldout_n}",
                 "trainer.warm_start.enabled=true", *source, *([f"trainer.steps={steps}"] if steps else []),
                 *overrides]
        plan = prepare_run(env, overrides=extra)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # the run's closing lines; stdout is the JSON lines
            code = train(plan)
        wall = time.perf_counter() - t0
        run_dir = plan.run_dir
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
        evals = {r["phase"]: r for r in _jsonl(run_dir / "eval.jsonl")}
        metrics = _jsonl(run_dir / "metrics.jsonl")
        warm = summary.get("warm_start", {})
        leaked = sorted(set(warm.get("task_ids", [])) & set(summary.get("heldout_task_ids", [])))
        dtype = autocast_dtype(plan.config.trainer.dtype, "cpu")
        ratio, why = (trl_sft_ratio(run_dir, warm.get("tokens_per_s"), dtype) if compare_trl
                      else (None, "compared on the first seed only"))

    def rate(phase: str) -> float | None:
        return evals[phase]["heldout_success"] if phase in evals else None

    def ci(phase: str) -> list[float] | None:
        return [evals[phase]["heldout_ci_low"], evals[phase]["heldout_ci_high"]] if phase in evals else None

    gain = gain_ci = None
    gain_ci_kind = None
    if "final" in evals and "warm_start" in evals:
        f, w = evals["final"], evals["warm_start"]
        gain = f["heldout_success"] - w["heldout_success"]
        paired = rl_gain(list(evals.values()))
        if paired is not None:
            gain_ci, gain_ci_kind = [paired["ci_low"], paired["ci_high"]], "paired"
        else:
            gain_ci = list(newcombe_diff_ci(f["heldout_success"], f["heldout_n"], w["heldout_success"], w["heldout_n"]))
            gain_ci_kind = "two-sample"
    return {
        "bench": "learning-multi-turn", "time": utc_now(), "env": env, "exit_code": code,
        "heldout_split": plan.config.eval.split, "heldout_n": heldout_n,
        "heldout_samples": plan.config.eval.samples, "heldout_temperature": plan.config.eval.temperature,
        "heldout_base": rate("base"), "heldout_base_ci95": ci("base"),
        "heldout_warm": rate("warm_start"), "heldout_warm_ci95": ci("warm_start"),
        "heldout_rl": rate("final"), "heldout_rl_ci95": ci("final"),
        "rl_gain": gain, "rl_gain_ci95": gain_ci, "rl_gain_ci_kind": gain_ci_kind,
        "heldout_valid_call_rate": {p: r["heldout_valid_call_rate"] for p, r in evals.items()},
        "wall_s": {"total": wall, "base_eval": evals.get("base", {}).get("eval_s"),
                   "demonstrations": warm.get("collect_s"), "sft": warm.get("train_s"),
                   "rl_incl_evals": summary.get("wall_s")},
        "learner_dtype": dtype, "sft_tokens_per_s": warm.get("tokens_per_s"), "sft_tokens_per_s_over_trl": ratio,
        **({"sft_tokens_per_s_over_trl_missing": why} if why else {}),
        "warm_start_loss": [warm.get("first_loss"), warm.get("final_loss")],
        # null for a step that trained nothing (dynamic sampling found no group with a reward spread)
        "train_reward_mean": [None if m.get("skipped") else m.get("reward_mean") for m in metrics],
        "leak_check": "ok" if not leaked else f"held-out ids in the warm-start data: {leaked[:5]}",
        "rl_steps": plan.config.trainer.steps, "seed": plan.config.run.seed,
        "load_before": load_before, "load_after": load_average(),
        # each task's success rate (0/1 for one episode a task; successes / eval.samples for several)
        "_outcomes": {p: {t: v / r.get("heldout_samples", 1) for t, v in r.get("heldout_outcomes", {}).items()}
                      for p, r in evals.items()},
    }


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="bench/learning.py --multi-turn", description=__doc__.split("\n")[0])
    ap.add_argument("--multi-turn", action="store_true")
    ap.add_argument("--env", default="search,code,swe",
                    help="comma-separated envs: built-in names or foreign ones (reasoning_gym:NAME, textarena:GAME)")
    ap.add_argument("--heldout-n", type=int, default=100)
    ap.add_argument("--heldout-samples", type=int, default=1,
                    help="episodes per held-out task at the sampling temperature (avg@K; 1: one greedy episode)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps (default: the env config's)")
    ap.add_argument("--seeds", type=int, default=1, help="runs per env (run.seed=0..K-1), pooled in a last line")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    ap.add_argument("overrides", nargs="*", metavar="key.path=value")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.heldout_samples < 1:
        ap.error(f"--seeds and --heldout-samples must be >= 1, got {args.seeds} and {args.heldout_samples}")
    for env in [e.strip() for e in args.env.split(",") if e.strip()]:
        records = []
        for seed in range(args.seeds):
            seeded = [*args.overrides, f"run.seed={seed}"] if args.seeds > 1 else args.overrides
            keep = args.keep / f"seed{seed}" if args.keep and args.seeds > 1 else args.keep
            records.append(run_env(env, args.heldout_n, args.steps, seeded, keep, compare_trl=seed == 0,
                                   heldout_samples=args.heldout_samples))
            emit({k: v for k, v in records[-1].items() if not k.startswith("_")})
        if args.seeds > 1:
            emit(pool_seeds(records))
    return 0
