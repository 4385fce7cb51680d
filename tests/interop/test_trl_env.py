"""`--env trl:pkg.module:Class env.kwargs.tasks=rows.jsonl` (issue 53): an environment class written
the way TRL's GRPOTrainer docs write one for `environment_factory` (reset(**row), a public method
as a tool, get_reward), with a trainer-owned reward function; the env check and a two-step
training run through the CLI; one line for an unknown class, no reward, no rows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import agentrl
from agentrl.config import ConfigError
from agentrl.parsing import ToolCall
from tests.support.interop import TINY, jsonl, one_error_line, run_cli

# TRL's docs example (grpo_trainer.md, "Providing an external dataset"), with the docstring TRL
# needs for the tool schema and a trainer-owned reward over the completion.
ENV_MODULE = '''
class IncrementEnv:
    def reset(self, target, **kwargs) -> str | None:
        self.counter = 0
        self.target = target
        self.reset_kwargs = dict(kwargs)
        return " Use the increment tool."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


SEEN = []


def format_reward(completions, environments, target, **kwargs):
    SEEN.append({"completions": completions, "target": target, "keys": sorted(kwargs)})
    return [0.5 if "done" in completion[-1]["content"] else 0.0 for completion in completions]
'''


@pytest.fixture
def env_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "increment_env.py").write_text(ENV_MODULE)
    with open(tmp_path / "rows.jsonl", "w") as f:
        for i in range(10):
            target = i % 6 + 1
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"Increment the counter to {target}."}],
                                "target": target}) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


NAME = "trl:increment_env:IncrementEnv"
KWARGS = {"tasks": "rows.jsonl", "reward_funcs": ["increment_env:format_reward"]}


def test_rows_tools_and_rewards_follow_trls_contract(env_dir: Path) -> None:
    import increment_env

    env = agentrl.make(NAME, **KWARGS)
    try:
        train, test = env.tasks("train"), env.tasks("test")
        assert len(train) == 8 and [t["id"] for t in test] == ["trl/rows/4", "trl/rows/9"]  # every fifth row
        assert [t.name for t in env.tools] == ["increment"]
        assert env.tools[0].parameters["properties"]["step"] == {"type": "integer",
                                                                  "description": "Value to add to the counter."}
        task = train[2]
        messages, _ = env.reset(options={"task": task})
        assert messages[1] == {"role": "user", "content": f"Increment the counter to {task['target']}. Use the "
                                                          "increment tool."}
        assert env.instance.reset_kwargs["prompt"] == task["prompt"]  # reset(**row): the prompt column too
        assert "id" not in env.instance.reset_kwargs  # agentrl's own row id is not a column
        call = env.tool_parser.format_call(ToolCall("increment", {"step": task["target"]}))
        observation, _, terminated, _, _ = env.step(call)
        assert observation == [{"role": "tool", "name": "increment", "content": str(task["target"])}]
        assert not terminated
        _, _, terminated, truncated, info = env.step("done")  # no tool call: the final answer
        assert terminated and not truncated and info["ended_by"] == "answer"
        assert info["reward_components"] == {"reward": 1.5, "format_reward": 0.5, "IncrementEnv": 1.0}
        seen = increment_env.SEEN[-1]
        assert seen["target"] == [task["target"]]
        assert [m["role"] for m in seen["completions"][0]] == ["assistant", "tool", "assistant"]
        assert {"prompts", "completion_ids", "trainer_state", "log_extra", "log_metric"} <= set(seen["keys"])

        env.reset(options={"task": task})  # the same instance, reset: a fresh episode
        _, _, _, _, info = env.step("I give up")
        assert info["reward_components"]["IncrementEnv"] == 0.0 and info["outcome_reward"] == 0.0
    finally:
        env.close()


def test_env_check_passes(env_dir: Path) -> None:
    out = run_cli("env", "check", NAME, "tasks=rows.jsonl", "reward_funcs=[increment_env:format_reward]",
                  cwd=env_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK:" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (the model trains); a loaded one takes several times that
def test_train_two_steps_through_the_cli(env_dir: Path) -> None:
    out = run_cli("train", "--env", NAME, "env.kwargs.tasks=rows.jsonl",
                  "env.kwargs.reward_funcs=[increment_env:format_reward]", "trainer.steps=2",
                  f"run.dir={env_dir / 'runs'}", "run.name=trl", "env.max_turns=2", *TINY, cwd=env_dir)
    assert out.returncode == 0, out.stderr[-3000:]
    run = env_dir / "runs" / "trl"
    rows = jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and rows[-1]["policy_tokens"] > 0
    trajs = jsonl(run / "trajectories.jsonl")
    assert trajs and {t["task_id"] for t in trajs} <= {f"trl/rows/{i}" for i in (0, 1, 2, 3, 5, 6, 7, 8)}
    assert (run / "report" / "index.html").is_file()


def test_unknown_class_names_close_matches_exit_2(env_dir: Path) -> None:
    out = run_cli("train", "--env", "trl:increment_env:IncrementEnvv", "env.kwargs.tasks=rows.jsonl",
                  f"run.dir={env_dir / 'runs'}", cwd=env_dir)
    assert out.returncode == 2
    line = one_error_line(out)
    assert "unknown class 'IncrementEnvv'" in line and "did you mean IncrementEnv" in line
    assert not (env_dir / "runs").exists()


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"tasks": "rows.jsonl", "reward_funcs": ["increment_env:format_rewrd"]},
     "unknown reward function 'format_rewrd'; did you mean format_reward"),
    ({"reward_funcs": ["increment_env:format_reward"]}, "needs its dataset rows: set env.kwargs.tasks=ROWS.jsonl"),
    ({"tasks": "nope.jsonl"}, "no such file nope.jsonl"),
])
def test_bad_kwargs_are_one_line(env_dir: Path, kwargs: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        agentrl.make(NAME, **kwargs)


def test_no_reward_source_and_an_undocumented_tool_are_named(env_dir: Path) -> None:
    (env_dir / "plain_env.py").write_text(
        "class NoReward:\n    def reset(self, **row):\n        return None\n\n"
        "    def act(self, x: int) -> int:\n        '''Act.\n\n        Args:\n            x: a number\n        '''\n"
        "        return x\n\n\nclass NoDoc:\n    def reset(self, **row):\n        return None\n\n"
        "    def get_reward(self):\n        return 0.0\n\n    def act(self, x: int) -> int:\n        return x\n")
    with pytest.raises(ConfigError, match=r"has no reward: set env\.kwargs\.reward_funcs"):
        agentrl.make("trl:plain_env:NoReward", tasks="rows.jsonl")
    with pytest.raises(ConfigError, match=r"NoDoc\.act cannot be a tool: .*docstring"):
        agentrl.make("trl:plain_env:NoDoc", tasks="rows.jsonl")
