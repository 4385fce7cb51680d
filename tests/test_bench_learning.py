"""bench/learning.py: the curve arithmetic (fast) and one real smallest-mode run (slow)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "bench"))
    sys.modules[f"bench_{name}"] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


learning = _load("learning")
run_all = _load("run_all")
_trl_runner = _load("_trl_runner")


def test_means_at_checkpoints_windows_and_weights() -> None:
    points = [(10.0, 0.0, 8), (25.0, 0.5, 8), (29.0, 1.0, 4), (95.0, 0.25, 8)]
    got = learning.means_at_checkpoints(points, budget_s=60, n=2)
    assert [c["t_s"] for c in got] == [30.0, 60.0]
    assert got[0]["reward"] == pytest.approx((0 * 8 + 0.5 * 8 + 1.0 * 4) / 20)  # trajectory-weighted
    assert got[0]["trajectories"] == 20
    assert got[1]["reward"] == 0.25  # a batch after the budget counts in the last window
    assert learning.means_at_checkpoints([(5.0, 1.0, 8)], 60, 3)[1]["reward"] is None
    lengths = learning.means_at_checkpoints([(10.0, 100.0, 8), (25.0, 40.0, 8)], 60, 2, key="tokens")
    assert [c["tokens"] for c in lengths] == [70.0, None]  # any per-batch mean, under its own name
    with pytest.raises(ValueError, match="budget_s"):
        learning.means_at_checkpoints(points, 0, 2)


def test_time_to_level_uses_trailing_mean() -> None:
    points = [(1.0, 0.0, 8), (2.0, 1.0, 8), (3.0, 1.0, 8), (4.0, 1.0, 8)]
    assert learning.time_to_level(points, 0.5, window=3) == 2.0  # (0 + 1) / 2
    assert learning.time_to_level(points, 0.9, window=3) == 4.0  # 3 ones
    assert learning.time_to_level(points, 1.1) is None
    assert learning.final_reward(points, budget_s=4.5) == 1.0  # batches after 3 s


def test_steps_per_hour_over_trl_counts_steps_within_the_budget_and_compares_finals() -> None:
    budget = 900.0
    ours = [(100.0, 0.5, 8), (400.0, 0.75, 8), (700.0, 1.0, 8), (899.0, 0.75, 8), (950.0, 1.0, 8)]
    trl = [(300.0, 0.5, 8), (650.0, 0.625, 8), (890.0, 0.75, 8)]
    assert learning.steps_per_hour(ours, budget) == 16.0  # 4 finished by 900 s; the one at 950 s is not counted
    assert learning.steps_per_hour(trl, budget) == 12.0
    lo, hi = learning.final_reward_ci95(trl, budget)  # batches after 600 s: 11 of 16 trajectories
    assert lo < 11 / 16 < hi
    # the steps whose batch had an advantage: agentrl's all-solved batch at 700 s had none, nor TRL's at 650 s
    signal = {"laminar": [100.0, 400.0, 899.0, 950.0], "trl": [300.0, 890.0], "sync": [890.0]}
    assert learning.per_hour(signal["laminar"], budget) == 12.0
    systems = {name: {"steps_per_hour": learning.steps_per_hour(p, budget),
                      "signal_steps_per_hour": learning.per_hour(signal[name], budget),
                      "reward_final": learning.final_reward(p, budget),
                      "reward_final_ci95": learning.final_reward_ci95(p, budget)}
               for name, p in (("laminar", ours), ("trl", trl), ("sync", [(890.0, 0.0, 8)]))}
    got = learning.versus_trl(systems)
    assert got["steps_per_hour_over_trl"] == {"laminar": 1.33, "sync": 0.33}
    assert got["signal_steps_per_hour_over_trl"] == {"laminar": 1.5, "sync": 0.5}
    assert got["final_reward_not_below_trl_ci"] == {"laminar": True, "sync": False}
    assert learning.versus_trl({k: v for k, v in systems.items() if k != "trl"}) == {}


def test_prompt_is_the_code_task_stub() -> None:
    task = learning.bench_tasks(learning.Settings(num_tasks=3))[0]
    system, user = learning.prompt_messages(task)
    assert system["role"] == "system" and "```python" in system["content"]
    assert task["entry_point"] in user["content"] and task["prompt"].strip() in user["content"]


async def test_grade_runs_hidden_tests_in_a_real_sandbox() -> None:
    task = learning.bench_tasks(learning.Settings(num_tasks=1))[0]
    assert await learning.grade(task, "```python\n" + task["solution"] + "```") == 1.0
    wrong = task["solution"].replace("return", "return 1 + ", 1)
    assert await learning.grade(task, wrong) == 0.0


def test_last_json_line_skips_logs() -> None:
    assert run_all.last_json_line('loading\n{"a": 1}\nnot json {\n') == {"a": 1}
    assert run_all.last_json_line("nothing here\n") is None


def test_run_all_reports_a_missing_script(tmp_path: Path) -> None:
    out = run_all.run_one("no_such_bench", 5, bench_dir=ROOT / "bench")
    assert out["status"] == "missing" and "no_such_bench.py" in out["error"]


def test_bad_arguments_are_named() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "learning.py"), "--systems", "laminar,foo"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "foo" in proc.stderr


def test_trl_runs_on_the_threads_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's runner gets --trl-threads (default every core, as agentrl's learner), not a fixed 1."""
    runner_python = tmp_path / "python"
    runner_python.touch()
    monkeypatch.setattr(learning, "TRL_PYTHON", runner_python)
    monkeypatch.setattr("agentrl.models.resolve_model", lambda name: tmp_path)
    commands = []

    def run(cmd, **kwargs):
        commands.append(cmd)
        raise subprocess.TimeoutExpired(cmd, 0)  # no result file: run_trl names the failure

    monkeypatch.setattr(learning.subprocess, "run", run)
    with pytest.raises(RuntimeError):
        learning.run_trl(learning.Settings(), tmp_path, threads=3)
    assert commands[0][commands[0].index("--threads") + 1] == "3"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_both_learners_train_in_the_precision_asked_for(dtype: str, tmp_path: Path) -> None:
    """--dtype reaches agentrl's trainer (and so its engine) and TRL's GRPOConfig alike."""
    s = learning.Settings(dtype=dtype)
    assert learning.agentrl_config(s, "global-async").trainer.dtype == dtype
    kwargs = _trl_runner.grpo_config_kwargs(json.loads(json.dumps(asdict(s))), tmp_path)  # as the runner gets it
    assert kwargs["bf16"] is (dtype == "bfloat16") and kwargs["model_init_kwargs"] == {"dtype": "float32"}


@pytest.mark.slow
def test_learning_smallest_mode_prints_its_json_line(tmp_path: Path) -> None:
    """The real thing, smallest: agentrl's laptop default (`global-async`) and `sync` backends, real
    model, real sandbox, 20 s budget each."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "learning.py"), "--systems", "global-async,sync",
                           "--budget-s", "20", "--max-tokens", "32", "--num-tasks", "20",
                           "--group-size", "2", "--prompts-per-step", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["bench"] == "learning" and record["errors"] == {}
    points = json.loads((tmp_path / "learning.json").read_text())["points"]
    for name in ("global-async", "sync"):
        system = record["systems"][name]
        assert system["steps"] >= 1 and system["trajectories"] >= 2, name
        assert 0.0 <= system["reward_first_batch"] <= 1.0
        assert len(system["reward_at"]) == 6
        assert 0 <= system["signal_steps_per_hour"] <= system["steps_per_hour"]
        assert 0 < system["completion_tokens_mean"] <= 32  # --max-tokens
        tokens_at = [c["tokens"] for c in system["completion_tokens_at"] if c["tokens"] is not None]
        assert len(system["completion_tokens_at"]) == 6 and tokens_at and all(0 < n <= 32 for n in tokens_at)
        # a step's seconds, split: waiting for groups, the update, the push, the barrier
        assert system["learn_s_mean"] > 0 and min(system[f"{p}_s_mean"] for p in ("wait", "push", "barrier")) >= 0
        assert points[name]
    assert record["settings"]["budget_s"] == 20 and record["load_avg_before"] is not None
    assert record["settings"]["dtype"] in ("bfloat16", "float32")  # --dtype auto resolved before the runs
    assert (tmp_path / "learning.png").stat().st_size > 1000
