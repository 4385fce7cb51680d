"""One whole `Learner.step` on the same batch under the issue-16 baseline settings and under the
env config's own; prints one JSON line.

    python bench/learner_step.py [--env search] [--steps 3]
    python bench/learner_step.py --env swe --prefix 1100 --suffixes 1400,1500   # swe-sized rows (~2.5k tokens)

The baseline is what the learner ran before issue 16: fp32 forward and backward, no activation
checkpointing, torch AdamW with fp32 moments. The other arm is the config as `agentrl train`
loads it (`trainer.dtype: auto`, per-layer activation checkpointing, `trainer.optimizer: auto`,
that is bf16 autocast where the CPU multiplies bf16 natively and bitsandbytes' 8-bit AdamW). Both
are built by the CLI's factory (`make_learner`) and train the same batch: the config's
`batch_groups` groups of `rollout.group_size` rows, by default shaped like a `search` RL batch (a
shared ~460-token prompt and ~400 tokens of turns per row, bench/learner.py's rows), rewards 0/1 in each
group, behaviour log-probs the model's own. Each arm runs in its own process, so its peak RSS is
its own; the first step allocates the optimizer state, so the figures are the median of the later
steps. Keys: `baseline_step_s`, `config_step_s`, `step_speedup` (baseline / config),
`*_tokens_per_s` (policy and context tokens trained per second), `*_peak_rss_gb`, and the
config's resolved `dtype` and optimizer.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.config import load_config
from agentrl.models import resolve_configured
from agentrl.trainer.distributed import make_learner
from agentrl.trainer.logprobs import token_logprobs
from agentrl.types import Group, Segment, Status, Trajectory
from bench._common import emit, machine_info
from bench.learner import search_like_rows

# What the learner ran before issue 16 (the arm the "no worse than today's" compares to).
BASELINE = ["trainer.dtype=float32", "trainer.activation_checkpointing=false", "trainer.optimizer=adamw"]


def search_like_groups(model: torch.nn.Module, n_groups: int, group_size: int, temperature: float,
                       prefix: int, suffixes: list[int]) -> list[Group]:
    """`n_groups` groups of `group_size` rows (bench/learner.py's shape: `prefix` shared tokens, then
    `suffixes[i % len]` tokens), rewards alternating 0/1, behaviour log-probs the model's own."""
    lengths = [suffixes[i % len(suffixes)] for i in range(group_size)]
    groups = []
    for g in range(n_groups):
        ids, attn, positions = search_like_rows(prefix, lengths, model.config.vocab_size, seed=g)
        trajectories = []
        for row in range(group_size):
            n = int(attn[row].sum())
            tokens, policy = ids[row, :n], positions[row, :n]
            with torch.no_grad():
                logp = token_logprobs(model, tokens.unsqueeze(0), temperature=temperature)[0]
            seg = Segment(prompt_len=prefix)
            start = 0
            for end in [i for i in range(1, n) if policy[i] != policy[i - 1]] + [n]:
                is_policy = bool(policy[start])
                seg.append(tokens[start:end].tolist(), policy=is_policy, version=0,
                           logprobs=logp[start:end].tolist() if is_policy else None)
                start = end
            reward = float(row % 2)
            trajectories.append(Trajectory(id=f"t{g}-{row}", group_id=f"g{g}", task_id=f"g{g}", segments=[seg],
                                           reward=reward, outcome_reward=reward, status=Status.FINISHED))
        groups.append(Group(id=f"g{g}", task_id=f"g{g}", trajectories=trajectories))
    return groups


def run_arm(env: str, overrides: list[str], steps: int, prefix: int, suffixes: list[int]) -> dict:
    """In this process: build the learner as the CLI does, train `steps` steps on the same batch."""
    cfg = load_config(env, overrides=overrides)
    learner = make_learner(resolve_configured(cfg.model), cfg.trainer, cfg.sampling.temperature, cfg.reward)
    groups = search_like_groups(learner.model, cfg.trainer.batch_groups, cfg.rollout.group_size,
                                cfg.sampling.temperature, prefix, suffixes)
    seconds, metrics = [], {}
    for _ in range(steps):  # the step leaves the groups as they were (it builds its batch from them)
        t0 = time.perf_counter()
        metrics = learner.step(groups)
        seconds.append(time.perf_counter() - t0)
    return {"step_s": seconds, "rows": sum(len(g.trajectories) for g in groups), "tokens": metrics.get("num_tokens"), "policy_tokens": metrics.get("num_policy_tokens"),
            "dtype": str(learner.dtype).removeprefix("torch."), "optimizer": type(learner.optimizer).__module__
            + "." + type(learner.optimizer).__name__,
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="search", help="whose config the learner takes (batch size, loss, optimizer)")
    ap.add_argument("--steps", type=int, default=3, help="steps per arm; the first allocates the optimizer state")
    ap.add_argument("--prefix", type=int, default=460, help="tokens every row of a group shares")
    ap.add_argument("--suffixes", default="410,380,430,400", help="each row's tokens after the prefix (cycled)")
    ap.add_argument("--arm", choices=["baseline", "config"], help=argparse.SUPPRESS)  # a child process's arm
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be >= 2: the first step allocates the optimizer state and is not timed")
    if args.arm:
        suffixes = [int(n) for n in args.suffixes.split(",")]
        print(json.dumps(run_arm(args.env, BASELINE if args.arm == "baseline" else [], args.steps, args.prefix,
                                 suffixes)))
        return
    arms = {}
    for arm in ("baseline", "config"):
        out = subprocess.run([sys.executable, __file__, "--env", args.env, "--steps", str(args.steps), "--arm", arm,
                              "--prefix", str(args.prefix), "--suffixes", args.suffixes],
                             capture_output=True, text=True, check=True)
        arms[arm] = json.loads(out.stdout.strip().splitlines()[-1])
    base_s, cfg_s = (statistics.median(arms[a]["step_s"][1:]) for a in ("baseline", "config"))
    tokens = arms["config"]["tokens"]
    emit({"bench": "learner_step", "env": args.env, "rows": arms["config"]["rows"], "prefix": args.prefix, "suffixes": args.suffixes,
          "tokens": tokens, "policy_tokens": arms["config"]["policy_tokens"],
          "baseline_step_s": round(base_s, 2), "config_step_s": round(cfg_s, 2),
          "step_speedup": round(base_s / cfg_s, 3),
          "baseline_tokens_per_s": round(tokens / base_s, 1), "config_tokens_per_s": round(tokens / cfg_s, 1),
          "baseline_first_step_s": round(arms["baseline"]["step_s"][0], 2),
          "config_first_step_s": round(arms["config"]["step_s"][0], 2),
          "baseline_peak_rss_gb": arms["baseline"]["peak_rss_gb"], "config_peak_rss_gb": arms["config"]["peak_rss_gb"],
          "baseline_setting": BASELINE, "config_dtype": arms["config"]["dtype"],
          "config_optimizer": arms["config"]["optimizer"], "machine": machine_info()})


if __name__ == "__main__":
    main()
