"""The `agentrl` command: help, dry runs, and bad input stopping before any work (exit 2)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.cli import main
from agentrl.evaluate import wilson_interval

AGENTRL = [sys.executable, "-m", "agentrl.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENTRL, *args], capture_output=True, text=True, timeout=120)


def test_help_lists_the_commands() -> None:
    out = run("--help")
    assert out.returncode == 0
    for command in ["train", "eval", "envs", "env", "sandbox", "swe", "report"]:
        assert command in out.stdout
    assert "--debug" in out.stdout  # the traceback switch for any failure (tests/test_cli_errors.py)


def test_dry_run_prints_the_resolved_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--env", "code", "--dry-run", "trainer.lr=3e-6", "--backend", "sync"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["env"]["name"] == "code"
    assert cfg["trainer"]["lr"] == pytest.approx(3e-6)
    assert cfg["laminar"]["backend"] == "sync"


def test_dry_run_marks_what_differs_from_the_defaults(tmp_path: Path) -> None:
    """The README's `agentrl train --env search --dry-run`: each value the env's config or the
    command line changed is marked with its default, the rest are not, and the output loads back."""
    out = run("train", "--env", "search", "--dry-run", "trainer.steps=2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "  steps: 2  # set (default: 10)" in lines  # the command line's
    assert "  name: search  # set (default: code)" in lines  # the env's
    assert "  lr: 1.0e-05" in lines and "  group_size: 4" in lines  # left at their defaults: unmarked
    (tmp_path / "dry.yaml").write_text(out.stdout)
    again = run("train", "--env", "search", "--config", str(tmp_path / "dry.yaml"), "--dry-run")
    assert again.returncode == 0 and yaml.safe_load(again.stdout) == yaml.safe_load(out.stdout)


def test_bad_value_exits_2_with_the_key_named() -> None:
    out = run("train", "--env", "code", "trainer.lr=abc", "--dry-run")
    assert out.returncode == 2
    assert "trainer.lr" in out.stderr and "expected float" in out.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["train", "--env", "nosuchenv"], "unknown env 'nosuchenv'"),
    (["train", "--env", "nosuchmod.x:Env"], "cannot be loaded"),
    (["train", "--env", "code", "trainer.nosuch=1"], "unknown config key 'trainer.nosuch'"),
    (["train"], "--env is required"),
    (["train", "--resume", "/nonexistent-run"], "no config.yaml"),
    (["train", "--env", "swe", "trainer.num_learners=2", "trainer.optimizer=adamw8bit"],
     "set trainer.optimizer=adamw (or auto) with trainer.num_learners > 1"),
    (["train", "--env", "code", "trainer.device=cuda"], "trainer.device=cuda needs a GPU per learner"),
    (["train", "--env", "code", "engine.device=cuda"], "engine.device=cuda but torch sees no GPU here"),
])
def test_bad_input_stops_before_work(args: list[str], message: str, tmp_path: Path) -> None:
    out = run(*args, f"run.dir={tmp_path}") if args[-1] != "train" and "--resume" not in args else run(*args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert not any(tmp_path.iterdir())  # no run directory was created


def test_eval_scores_the_embedded_model_on_held_out_tasks() -> None:
    """The README's `agentrl eval --env NAME --n N`: the real embedded model, real episodes of the
    search env, one JSON line of figures."""
    out = run("eval", "--env", "search", "--n", "2", "sampling.max_tokens=16", "env.max_turns=2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "success rate" in out.stdout and "valid-call rate" in out.stdout
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["n"] == 2 and 0 <= figures["success_rate"] <= 1 and figures["errors"] == 0
    assert 1 <= figures["turns_mean"] <= 2 and 0 < figures["tokens_mean"] <= 2 * 16
    # configs/search.yaml's eval.group_by: the same episodes counted per question kind
    by_kind = figures["by_group"]
    assert sum(c["n"] for c in by_kind.values()) == 2
    assert sum(c["successes"] for c in by_kind.values()) == round(2 * figures["success_rate"])
    assert "by kind: " + ", ".join(f"{k} {c['successes']}/{c['n']}" for k, c in by_kind.items()) in out.stdout
    # per task, so two checkpoints' runs on the same tasks can be paired: the first 2 test questions
    assert len(figures["outcomes"]) == 2 and all(t.startswith("search/") for t in figures["outcomes"])
    assert sum(figures["outcomes"].values()) == figures["successes"]


def test_envs_lists_builtins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["envs"]) == 0
    listed = capsys.readouterr().out
    for name in ["code", "search", "swe", "summarize"]:
        assert name in listed


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(0, 8)
    assert lo == 0.0 and 0.3 < hi < 0.33  # 0/8 still leaves room up to ~32%
    lo, hi = wilson_interval(4, 8)
    assert lo < 0.5 < hi and hi - 0.5 == pytest.approx(0.5 - lo)
    assert wilson_interval(8, 8)[1] == 1.0
