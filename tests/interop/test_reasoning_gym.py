"""`--env reasoning_gym:NAME[+NAME...]` (issue 53) against the real reasoning-gym package: the env
check and a two-step training run through the CLI, disjoint splits, the dataset's own scoring,
and one line for a missing package or an unknown dataset."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentrl
from agentrl.parsing import ToolCall
from tests.support.interop import TINY, jsonl, one_error_line, run_cli, without_packages

reasoning_gym = pytest.importorskip("reasoning_gym")  # CI installs .[interop]; AGENTRL_REQUIRE_ALL fails the skip

SPEC = "reasoning_gym:chain_sum+basic_arithmetic"


def _submit(env: agentrl.ToolEnv, answer: str) -> str:
    return env.tool_parser.format_call(ToolCall("submit", {"answer": answer}))


def test_splits_are_disjoint_and_the_reward_is_score_answer() -> None:
    env = agentrl.make(SPEC, num_tasks=40, num_test_tasks=20, seed=3)
    try:
        train, test = env.tasks("train"), env.tasks("test")
        assert len(test) == 20 and 30 <= len(train) <= 40  # train items asking a test question are dropped
        assert {t["dataset"] for t in train} == {"chain_sum", "basic_arithmetic"}
        assert not {t["id"] for t in train} & {t["id"] for t in test}
        assert not {t["question"] for t in train} & {t["question"] for t in test}
        assert agentrl.make(SPEC, num_tasks=40, num_test_tasks=20, seed=3).tasks("test") == test  # seeded
        task = train[0]
        scorer = reasoning_gym.create_dataset(task["dataset"], size=1, seed=0)
        entry = {k: task[k] for k in ("question", "answer", "metadata")}
        for answer in [task["answer"], "not a number", str(task["answer"]) + "1"]:
            messages, _ = env.reset(options={"task": task})
            assert messages[1]["content"] == task["question"]
            _, _, terminated, _, info = env.step(_submit(env, answer))
            assert terminated
            assert info["outcome_reward"] == scorer.score_answer(answer, entry)
        assert info["outcome_reward"] < 1.0  # the last answer was wrong
        env.reset(options={"task": task})
        observation, _, terminated, truncated, _ = env.step(f"The answer is {task['answer']}.")  # no tool call
        assert not (terminated or truncated) and "No tool call found" in observation[0]["content"]
    finally:
        env.close()


def test_success_only_pays_a_fully_correct_answer_and_keeps_the_partial_score() -> None:
    env = agentrl.make("reasoning_gym:basic_arithmetic", num_tasks=4, num_test_tasks=4, success_only=True)
    try:
        task = env.tasks("train")[0]
        padded = "1" + str(task["answer"])  # contains the answer: partial credit from score_answer
        rewards = {}
        for answer in [str(task["answer"]), padded]:
            env.reset(options={"task": task})
            *_, info = env.step(_submit(env, answer))
            rewards[answer] = (info["outcome_reward"], info["reward_components"]["score"])
        assert rewards[str(task["answer"])] == (1.0, 1.0)
        assert rewards[padded][0] == 0.0 and 0.0 < rewards[padded][1] < 1.0
    finally:
        env.close()


def test_env_check_passes_with_and_without_the_python_tool() -> None:
    out = run_cli("env", "check", SPEC, "num_tasks=20", "num_test_tasks=10")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "demonstrations reach the best reward" in out.stdout and "OK:" in out.stdout
    out = run_cli("env", "check", "reasoning_gym:chain_sum", "python=true", "num_tasks=5", "num_test_tasks=5")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS  close() releases the sandbox" in out.stdout  # the python tool ran in a real sandbox


@pytest.mark.slow
@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (the model trains); a loaded one takes several times that
def test_train_two_steps_through_the_cli_with_held_out_eval(tmp_path: Path) -> None:
    # The adapted env is an ordinary env: the held-out evaluation runs on its test split (its
    # demonstrations, the warm start's data, are played by the env check above).
    tiny = [a for a in TINY if not a.startswith("eval.")]
    out = run_cli("train", "--env", SPEC, "trainer.steps=2", f"run.dir={tmp_path}", "run.name=rg",
                  "env.kwargs.num_tasks=16", "env.kwargs.num_test_tasks=4", "eval.enabled=true", "eval.n=2", *tiny)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "rg"
    rows = jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[-1]["policy_tokens"] > 0
    evals = jsonl(run / "eval.jsonl")
    assert [e["phase"] for e in evals] == ["base", "final"]
    assert all(k.startswith("reasoning_gym/") and "/test/" in k for e in evals for k in e["heldout_outcomes"])
    trajs = jsonl(run / "trajectories.jsonl")
    assert trajs and all("/train/" in t["task_id"] for t in trajs)
    assert (run / "report" / "index.html").is_file()


def test_unknown_dataset_names_close_matches_exit_2(tmp_path: Path) -> None:
    out = run_cli("train", "--env", "reasoning_gym:chain_sun+basic_arithmetic", f"run.dir={tmp_path}")
    assert out.returncode == 2
    line = one_error_line(out)
    assert "unknown dataset 'chain_sun'" in line and "did you mean chain_sum" in line
    assert not list(tmp_path.iterdir())  # stopped before any work


def test_missing_package_names_the_extra_exit_1(tmp_path: Path) -> None:
    out = run_cli("train", "--env", SPEC, f"run.dir={tmp_path / 'runs'}", env=without_packages(tmp_path, "reasoning_gym"))
    assert out.returncode == 1
    line = one_error_line(out)
    assert "reasoning_gym package" in line and "pip install 'agentrl[reasoning-gym]'" in line
    assert not (tmp_path / "runs").exists()
