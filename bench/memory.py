"""Memory benchmark (issue 16): peak RSS of a training run, with a breakdown by component, or the
learner alone in several precisions.

    python bench/memory.py                       # `agentrl train --env code trainer.steps=1`, peak RSS
    python bench/memory.py --env swe -- trainer.steps=1
    python bench/memory.py --learner             # learner step: fp32 vs +ckpt vs bf16+ckpt

Run mode polls the RSS of the whole process tree (psutil, every 0.2 s) and prints one JSON line
with `peak_rss_gb` and `breakdown_gb`. The breakdown is computed from the model's parameter
count (weights, gradients, two Adam moments, weight copies for the engines), not measured per
component; `other_gb` (activations, engine KV cache, interpreter, sandboxes) is the remainder.

Learner mode times `Learner.step` on a synthetic batch of the real model in a fresh child process
per configuration (so each peak RSS is its own), and compares bf16 log-probs with fp32 ones.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, emit, git_commit, machine_info, utc_now

GB = 1 << 30
LEARNER_CONFIGS = {  # name -> trainer overrides
    "fp32": {"activation_checkpointing": False, "dtype": "float32"},
    "fp32_ckpt": {"activation_checkpointing": True, "dtype": "float32"},
    "bf16_ckpt": {"activation_checkpointing": True, "dtype": "bfloat16"},
}


def tree_rss(proc: Any) -> int:
    """RSS of a process and all its descendants, in bytes (vanished children count 0)."""
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_info().rss
    return total


def param_count(model_name: str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.models import resolve_model

    with __import__("torch").device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model(model_name)))
    return sum(p.numel() for p in model.parameters())


def run_mode(env: str, overrides: list[str], timeout_s: float) -> dict[str, Any]:
    import psutil

    run_dir = tempfile.mkdtemp(prefix="agentrl-mem-")
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", env, "--quiet", f"run.dir={run_dir}", *overrides]
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(child.pid)
    peak, timed_out = 0, False
    while child.poll() is None:
        peak = max(peak, tree_rss(proc))
        if time.perf_counter() - t0 > timeout_s:
            timed_out = True
            child.kill()
            break
        time.sleep(0.2)
    stderr = child.communicate()[1] or ""
    n = param_count("smollm2-135m")
    w = n * 4 / GB  # fp32
    # Learner weights + grads + 2 Adam moments; one engine model; one copy in flight for the push.
    parts = {"learner_weights": w, "gradients": w, "optimizer": 2 * w, "engine_weights": w, "push_copy": w}
    peak_gb = peak / GB
    return {"mode": "run", "env": env, "overrides": overrides, "exit_code": child.returncode, "timed_out": timed_out,
            "wall_s": round(time.perf_counter() - t0, 1), "peak_rss_gb": round(peak_gb, 3),
            "breakdown_gb": {**{k: round(v, 3) for k, v in parts.items()},
                             "other_gb": round(peak_gb - sum(parts.values()), 3)},
            "params": n, "stderr_tail": stderr.strip().splitlines()[-3:]}


def learner_child(name: str, rows: int, length: int, steps: int) -> dict[str, Any]:
    """One configuration, in this (fresh) process: tokens/s over `steps` timed steps after a warm-up."""
    import torch

    from agentrl.config import load_config
    from agentrl.trainer.learner import Learner
    from agentrl.trainer.logprobs import token_logprobs_and_stats
    from agentrl.types import Group, Segment, Status, Trajectory

    torch.manual_seed(0)
    over = [f"trainer.{k}={v}" for k, v in LEARNER_CONFIGS[name].items()]
    cfg = load_config(None, overrides=[*over, f"trainer.micro_batch_size={rows}"])
    learner = Learner("smollm2-135m", cfg.trainer)
    vocab = learner.model.config.vocab_size

    def groups() -> list[Group]:
        trajs = []
        for i in range(rows):  # half prompt / tool output, half policy tokens, like a multi-turn row
            seg = Segment(prompt_len=length // 2)
            seg.append(torch.randint(0, vocab, (length // 2,)).tolist(), policy=False)
            seg.append(torch.randint(0, vocab, (length // 2,)).tolist(), policy=True,
                       logprobs=[-8.0] * (length // 2), version=0)
            trajs.append(Trajectory(id=f"t{i}", group_id="g", task_id="g", segments=[seg], reward=float(i % 2),
                                    outcome_reward=float(i % 2), status=Status.FINISHED))
        return [Group(id="g", task_id="g", trajectories=trajs)]

    assert "skipped" not in learner.step(groups())  # warm-up (allocator, kernels)
    t0 = time.perf_counter()
    for _ in range(steps):
        learner.step(groups())
    dt = (time.perf_counter() - t0) / steps
    out = {"config": name, "step_s": round(dt, 2), "tokens_per_s": round(rows * length / dt, 1),
           "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}
    if name == "bf16_ckpt":  # log-prob agreement of the bf16 forward with fp32, same weights
        ids = torch.randint(0, vocab, (2, length))
        pos = torch.zeros_like(ids, dtype=torch.bool)
        pos[:, length // 2:] = True
        learner.model.eval()
        with torch.no_grad():
            ref = token_logprobs_and_stats(learner.model, ids, None, 1.0, positions=pos, entropy=False,
                                           sum_pi_sq=False).logprobs
            with learner._autocast():
                low = token_logprobs_and_stats(learner.model, ids, None, 1.0, positions=pos, entropy=False,
                                               sum_pi_sq=False).logprobs
        diff = (ref - low)[pos].abs()
        out.update(logprob_max_abs_diff=round(diff.max().item(), 5), logprob_mean_abs_diff=round(diff.mean().item(), 5))
    return out


def learner_mode(rows: int, length: int, steps: int) -> dict[str, Any]:
    results = {}
    for name in LEARNER_CONFIGS:
        cmd = [sys.executable, __file__, "--learner-child", name, "--rows", str(rows), "--length", str(length),
               "--steps", str(steps)]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"learner child {name} failed:\n{out.stderr[-2000:]}")
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    base = results["fp32"]["tokens_per_s"]
    return {"mode": "learner", "rows": rows, "length": length, "steps": steps, "results": results,
            "bf16_ckpt_over_fp32_tokens_per_s": round(results["bf16_ckpt"]["tokens_per_s"] / base, 3),
            "fp32_ckpt_over_fp32_tokens_per_s": round(results["fp32_ckpt"]["tokens_per_s"] / base, 3),
            "peak_rss_gb": max(r["peak_rss_gb"] for r in results.values())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="code")
    ap.add_argument("--timeout", type=float, default=300.0, help="kill the run after this many seconds")
    ap.add_argument("--learner", action="store_true", help="time the learner alone per precision")
    ap.add_argument("--learner-child", choices=list(LEARNER_CONFIGS), help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("overrides", nargs="*", help="dotted config overrides for the run (after --)")
    args = ap.parse_args(argv)
    if args.learner_child:
        print(json.dumps(learner_child(args.learner_child, args.rows, args.length, args.steps)), flush=True)
        return
    t0 = utc_now()
    rec = (learner_mode(args.rows, args.length, args.steps) if args.learner
           else run_mode(args.env, args.overrides or ["trainer.steps=1"], args.timeout))
    emit({"bench": "memory", "started": t0, "commit": git_commit(), "machine": machine_info(), **rec})


if __name__ == "__main__":
    main()
