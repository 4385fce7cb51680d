"""Memory benchmark (issue 16): peak RSS of a training run, with a breakdown by component, or the
learner alone in several precisions.

    python bench/memory.py                       # `agentrl train --env code trainer.steps=1`, peak RSS
    python bench/memory.py --env swe -- trainer.steps=1
    python bench/memory.py --learner             # learner step: fp32 vs +ckpt vs bf16+ckpt
    cd FRESH_CLONE && python /path/to/bench/memory.py --timeout 5400 --command 'make train'

Run mode polls the RSS of the whole process tree (psutil, every 0.2 s) and prints one JSON line
with `peak_rss_gb` and `breakdown_gb`; `peak_process_rss_gb` is the run's own process alone and
`peak_children_rss_gb` the most its children held at once (sandboxes running the policy's code).
The breakdown is computed from the model's parameter count (weights, gradients, two Adam moments
in fp32 or 8 bits as `trainer.optimizer` says, weight copies for the engines); `other_gb`
(activations, engine KV cache, interpreter, sandboxes) is the remainder.

Phase timeline (agentrl runs): the run writes a line to $AGENTRL_PHASE_LOG whenever it enters a
phase (agentrl/phases.py `mark_phase`: load_model, start_engines, prepare_stages, eval, warm_start,
push, rollout = the trainer waiting for a batch, learner_step, sync, checkpoint, done), with the
bytes of the tensors it tracks (learner weights, gradients, Adam state, engine weights, engine KV,
relay buffers; each storage counted once, by the first of them in that order that holds it: an
engine whose weights are views of the relay's snapshot shows them as engine_weights and the
relay's buffer as 0). Every RSS sample is assigned to the phase in force,
so the line says `peak_phase` and each phase's peak (`phases`), and `measured_gb` holds the
components as measured at the marks around the peak (`at_peak_start` / `at_peak_end`) and their
maximum over all marks (`max`). With the `global-async` backend the next batch is generated
while the learner steps, so `learner_step` RSS includes that rollout's KV. `--timeline FILE`
writes every sample with its phase.

Learner mode times `Learner.step` on a synthetic batch of the real model for each precision /
checkpointing setting, interleaved in one process, counts the bytes each keeps for backward, and
compares bf16 log-probs with fp32 ones.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.phases import PHASE_LOG_ENV
from bench._common import ROOT, emit, git_commit, machine_info, utc_now

GB = 1 << 30
LEARNER_CONFIGS = {  # name -> trainer overrides
    "fp32": {"activation_checkpointing": False, "dtype": "float32"},
    "fp32_ckpt": {"activation_checkpointing": True, "dtype": "float32"},
    "bf16_ckpt": {"activation_checkpointing": True, "dtype": "bfloat16"},
}


def tree_rss(proc: Any) -> tuple[int, int]:
    """Memory of a process and all its descendants, and of the process alone, in bytes (vanished
    ones count 0): a run's own memory apart from its children's (sandboxes, servers). The process
    counts its RSS, each descendant its USS (the pages only it maps): a child forked to start a
    sandbox shares all of its parent's pages until it execs, and its RSS would count them twice."""
    import psutil

    own = children = 0
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        own = proc.memory_info().rss
    for p in proc.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            children += p.memory_full_info().uss
    return own + children, own


def param_count(model_name: str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.models import resolve_model

    with __import__("torch").device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model(model_name)))
    return sum(p.numel() for p in model.parameters())


def peak_tree_rss(cmd: list[str], cwd: Path, timeout_s: float, env: dict[str, str] | None = None,
                  samples: list[tuple[float, int]] | None = None) -> dict[str, Any]:
    """Run `cmd`, polling the RSS of its process tree every 0.2 s; its stderr tail, exit code,
    wall time and peak. `samples` (if given) receives every (wall time, bytes) polled."""
    import psutil

    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: a chatty run cannot block on it
        child = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env)
        proc = psutil.Process(child.pid)
        peak = peak_own = peak_children = 0
        timed_out = False
        while child.poll() is None:
            rss, own = tree_rss(proc)
            peak, peak_own, peak_children = max(peak, rss), max(peak_own, own), max(peak_children, rss - own)
            if samples is not None:
                samples.append((time.time(), rss))
            if time.perf_counter() - t0 > timeout_s:
                timed_out = True
                for p in [*proc.children(recursive=True), proc]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.kill()
                break
            time.sleep(0.2)
        child.wait()
        err.seek(0)
        stderr = err.read()
    return {"exit_code": child.returncode, "timed_out": timed_out, "wall_s": round(time.perf_counter() - t0, 1),
            "peak_rss_gb": round(peak / GB, 3), "peak_process_rss_gb": round(peak_own / GB, 3),
            "peak_children_rss_gb": round(peak_children / GB, 3), "stderr_tail": stderr.strip().splitlines()[-3:]}


def phase_timeline(samples: list[tuple[float, int]], marks: list[dict[str, Any]],
                   timeline_path: str | None = None) -> dict[str, Any]:
    """Each RSS sample assigned to the phase marked last before it: the phase that peaked, each
    phase's peak and time, the phases in order (consecutive repeats merged), and the components
    measured at the marks around the peak."""
    if not samples:
        return {}
    times = [m["t"] for m in marks]
    t_start = samples[0][0]
    polled = samples
    # Each mark carries the run's RSS when it was written: a phase shorter than the poll interval
    # (a push of a small model takes ~0.1 s) still gets a sample. The run's own RSS is at most the
    # process tree's, so a mark never reports more than the tree held.
    samples = sorted([*samples, *((m["t"], m["rss"]) for m in marks if m.get("rss") and m["t"] >= t_start)])

    def at(t: float) -> int:  # index of the mark in force at time t (-1: before the first)
        return bisect.bisect_right(times, t) - 1

    def name(i: int) -> str:
        return marks[i]["phase"] if i >= 0 else "startup"

    per: dict[str, dict[str, float]] = {}
    spans: list[dict[str, Any]] = []
    for k, (t, rss) in enumerate(samples):
        ph = name(at(t))
        p = per.setdefault(ph, {"peak_gb": 0.0, "time_s": 0.0})
        p["peak_gb"] = max(p["peak_gb"], rss / GB)
        p["time_s"] += (samples[k + 1][0] - t) if k + 1 < len(samples) else 0.0
        if not spans or spans[-1]["phase"] != ph:
            spans.append({"phase": ph, "start_s": round(t - t_start, 1), "start_gb": round(rss / GB, 3),
                          "peak_gb": 0.0})
        spans[-1]["peak_gb"] = round(max(spans[-1]["peak_gb"], rss / GB), 3)
    t_peak, _ = max(samples, key=lambda s: s[1])
    i = at(t_peak)
    comps = {k for m in marks for k in m["components"]}

    def gb(m: dict[str, Any] | None) -> dict[str, float] | None:
        return {k: round(v / GB, 3) for k, v in m["components"].items()} if m else None

    out: dict[str, Any] = {
        "peak_phase": name(i), "peak_at_s": round(t_peak - t_start, 1),
        "phases": {k: {"peak_gb": round(v["peak_gb"], 3), "time_s": round(v["time_s"], 1)}
                   for k, v in per.items()},
        "timeline": spans[:200] if len(spans) <= 200 else [*spans[:100], *spans[-100:]],
        "measured_gb": {"at_peak_start": gb(marks[i] if i >= 0 else None),
                        "at_peak_end": gb(marks[i + 1] if i + 1 < len(marks) else None),
                        "max": {k: round(max(m["components"].get(k, 0) for m in marks) / GB, 3) for k in comps}},
    }
    if timeline_path:
        with open(timeline_path, "w") as f:
            for t, rss in polled:
                f.write(json.dumps({"t_s": round(t - t_start, 2), "rss_gb": round(rss / GB, 4),
                                    "phase": name(at(t))}) + "\n")
    return out


def run_mode(env: str, overrides: list[str], timeout_s: float, command: str | None = None,
             timeline_path: str | None = None) -> dict[str, Any]:
    """`agentrl train --env ENV OVERRIDES` from this checkout, or any shell `command` (e.g.
    `make train` in a fresh clone, which builds its own venv) in the current directory."""
    if command is not None:
        rec = peak_tree_rss(["bash", "-c", command], Path.cwd(), timeout_s)
        return {"mode": "command", "command": command, "cwd": str(Path.cwd()), **rec}
    # The run's checkpoints (~0.5 GB each) go with it: a benchmark leaves nothing on disk.
    with tempfile.TemporaryDirectory(prefix="agentrl-mem-") as run_dir:
        cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", env, "--quiet", f"run.dir={run_dir}",
               *overrides]
        marks_file = Path(run_dir) / "phases.jsonl"
        samples: list[tuple[float, int]] = []
        rec = peak_tree_rss(cmd, ROOT, timeout_s, env={**os.environ, PHASE_LOG_ENV: str(marks_file)},
                            samples=samples)
        marks = [json.loads(line) for line in marks_file.read_text().splitlines()] if marks_file.exists() else []
    rec.update(phase_timeline(samples, marks, timeline_path))
    n = param_count("smollm2-135m")
    w = n * 4 / GB  # fp32
    from agentrl.config import load_config

    # two fp32 moments, or (adamw8bit; auto in one learner process) two 8-bit codes plus an fp32
    # scale per 256 of each
    trainer = load_config(env, overrides=overrides).trainer
    eight_bit = trainer.optimizer == "adamw8bit" or (trainer.optimizer == "auto" and trainer.num_learners == 1)
    moments = 2 * w * (1 + 4 / 256) / 4 if eight_bit else 2 * w
    # Learner weights + grads + 2 Adam moments; one engine model; one copy in flight for the push.
    parts = {"learner_weights": w, "gradients": w, "optimizer": moments, "engine_weights": w, "push_copy": w}
    return {"mode": "run", "env": env, "overrides": overrides, **rec,
            "breakdown_gb": {**{k: round(v, 3) for k, v in parts.items()},
                             "other_gb": round(rec["peak_rss_gb"] - sum(parts.values()), 3)},
            "params": n}


def learner_mode(rows: int, length: int, rounds: int) -> dict[str, Any]:
    """The configurations side by side in one process on one model (interleaved rounds, so load
    drift on a shared machine hits them alike): step time, and the bytes each keeps for backward
    (saved-tensor hooks: exact, independent of load)."""
    import statistics

    import torch

    from agentrl.config import load_config
    from agentrl.trainer.learner import Learner, enable_activation_checkpointing
    from agentrl.trainer.logprobs import token_logprobs_and_stats
    from agentrl.types import Group, Segment, Status, Trajectory

    torch.manual_seed(0)
    learner = Learner("smollm2-135m", load_config(None, overrides=[f"trainer.micro_batch_size={rows}"]).trainer)
    vocab = learner.model.config.vocab_size
    ids = torch.randint(0, vocab, (rows, length))
    pos = torch.zeros_like(ids, dtype=torch.bool)
    pos[:, length // 2:] = True  # half prompt / tool output, half policy tokens, like a multi-turn row

    def groups() -> list[Group]:
        trajs = []
        for i in range(rows):
            seg = Segment(prompt_len=length // 2)
            seg.append(ids[i, :length // 2].tolist(), policy=False)
            seg.append(ids[i, length // 2:].tolist(), policy=True, logprobs=[-8.0] * (length - length // 2), version=0)
            trajs.append(Trajectory(id=f"t{i}", group_id="g", task_id="g", segments=[seg], reward=float(i % 2),
                                    outcome_reward=float(i % 2), status=Status.FINISHED))
        return [Group(id="g", task_id="g", trajectories=trajs)]

    def configure(name: str) -> None:
        over = LEARNER_CONFIGS[name]
        learner.dtype = over["dtype"]
        if over["activation_checkpointing"]:
            enable_activation_checkpointing(learner.model)
        else:
            (getattr(learner.model, "activation_checkpointing_disable", None)
             or learner.model.gradient_checkpointing_disable)()

    def saved_bytes() -> int:
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), learner._autocast():
            token_logprobs_and_stats(learner.model, ids, None, 1.0, positions=pos, entropy=False, sum_pi_sq=False)
        return total

    times: dict[str, list[float]] = {name: [] for name in LEARNER_CONFIGS}
    out: dict[str, dict[str, Any]] = {}
    for name in LEARNER_CONFIGS:
        configure(name)
        out[name] = {"saved_for_backward_gb": round(saved_bytes() / GB, 3)}
    configure("fp32")
    assert "skipped" not in learner.step(groups())  # warm-up (allocator, kernels)
    for _ in range(rounds):
        for name in LEARNER_CONFIGS:
            configure(name)
            t0 = time.perf_counter()
            learner.step(groups())
            times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
        dt = statistics.median(ts)
        out[name].update(step_s=round(dt, 2), tokens_per_s=round(rows * length / dt, 1))
    learner.model.eval()  # bf16 log-prob agreement with fp32, same weights
    with torch.no_grad():
        configure("fp32")
        ref = token_logprobs_and_stats(learner.model, ids, None, 1.0, positions=pos, entropy=False,
                                       sum_pi_sq=False).logprobs
        configure("bf16_ckpt")
        with learner._autocast():
            low = token_logprobs_and_stats(learner.model, ids, None, 1.0, positions=pos, entropy=False,
                                           sum_pi_sq=False).logprobs
    diff = (ref - low)[pos].abs()
    base = out["fp32"]["tokens_per_s"]
    return {"mode": "learner", "rows": rows, "length": length, "rounds": rounds, "results": out,
            "bf16_ckpt_over_fp32_tokens_per_s": round(out["bf16_ckpt"]["tokens_per_s"] / base, 3),
            "fp32_ckpt_over_fp32_tokens_per_s": round(out["fp32_ckpt"]["tokens_per_s"] / base, 3),
            "bf16_logprob_max_abs_diff": round(diff.max().item(), 5),
            "bf16_logprob_mean_abs_diff": round(diff.mean().item(), 5),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="code")
    ap.add_argument("--timeout", type=float, default=300.0, help="kill the run after this many seconds")
    ap.add_argument("--learner", action="store_true", help="time the learner alone per precision")
    ap.add_argument("--command", help="run this shell command instead (in the current directory), e.g. "
                                      "'make train' in a fresh clone")
    ap.add_argument("--timeline", help="run mode: write every RSS sample with its phase to this JSONL file")
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2, help="learner mode: timed steps per configuration")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides for the run (after --)")
    args = ap.parse_args(argv)
    t0 = utc_now()
    rec = (learner_mode(args.rows, args.length, args.rounds) if args.learner
           else run_mode(args.env, args.overrides or ["trainer.steps=1"], args.timeout, args.command, args.timeline))
    emit({"bench": "memory", "started": t0, "commit": git_commit(), "machine": machine_info(), **rec})


if __name__ == "__main__":
    main()
