"""`agentrl train` end to end on the embedded model: run directory, resume, SIGINT (issue 9).

Tiny budgets (2 tokens of thought are enough to exercise every box); these are the slowest tests
of the suite because each one loads the real model and trains it on the CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TINY = ["trainer.batch_groups=1", "rollout.group_size=2", "rollout.concurrency=2", "sampling.max_tokens=24",
        "env.max_turns=2", "trainer.micro_batch_size=2", "sandbox.pool_size=2",
        # the warm start and held-out eval have tests of their own (test_demos, test_heldout_report)
        "trainer.warm_start.enabled=false", "eval.enabled=false", "--quiet"]


def agentrl(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def trained(rows: list[dict]) -> int:
    return sum(not r.get("skipped") for r in rows)


def test_train_writes_run_dir_then_resume_continues_the_step_count(tmp_path: Path) -> None:
    run_dir = tmp_path / "code-run"
    out = agentrl("train", "--env", "code", "trainer.steps=2", "trainer.checkpoint_every=1",
                  f"run.dir={tmp_path}", "run.name=code-run", *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1]
    for key in ["reward_mean", "success_rate", "turns_mean", "policy_tokens", "staleness_mean", "loss",
                "sandbox_exec_p50_ms", "version"]:
        assert key in rows[-1], key
    # one weight version per global batch that trained (a batch of equal-reward groups is skipped)
    assert rows[-1]["version"] == trained(rows)
    assert {r["backend"] for r in rows} == {"global-async"}  # laminar.backend=auto, one local worker
    assert rows[-1]["policy_tokens"] > 0
    assert list((run_dir / "checkpoints").glob("step_*.pt"))
    assert (run_dir / "trajectories.jsonl").read_text().strip()
    for png in ["reward.png", "throughput.png", "staleness.png", "sandbox_latency.png"]:
        assert (run_dir / "report" / png).stat().st_size > 1000

    # DAPO dynamic sampling from the CLI: its draws and drops reach metrics.jsonl; if it runs out of
    # draws (2 here) the step trains on the groups kept instead of ending the run
    out = agentrl("train", "--resume", str(run_dir), "trainer.steps=3", "trainer.dynamic_sampling=true",
                  "trainer.max_gen_batches=2", "--quiet")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = metrics(run_dir)
    assert 1 <= rows[-1]["dapo_gen_batches"] <= 2 and "dapo_dropped_groups" in rows[-1]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[-1]["version"] == trained(rows)


def _bwrap_children() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "bwrap"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_sigint_saves_a_checkpoint_and_leaves_nothing_behind(tmp_path: Path) -> None:
    before = set(_bwrap_children())
    tmp_before = set(os.listdir("/tmp"))
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "train", "--env", "code", "trainer.steps=50",
                             "trainer.checkpoint_every=100", f"run.dir={tmp_path}", "run.name=sig", *TINY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "sig"
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if (run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text().strip():
            break
        time.sleep(2)
    assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err[-3000:]
    assert list((run_dir / "checkpoints").glob("step_*.pt")), "SIGINT must save a checkpoint"
    assert len(metrics(run_dir)) < 50
    time.sleep(1)
    assert set(_bwrap_children()) <= before, "sandbox processes leaked"
    leaked = {d for d in set(os.listdir("/tmp")) - tmp_before if d.startswith("agentrl")}
    assert not leaked, f"temp dirs leaked: {leaked}"
