"""The warm start without demonstrations (issue 53 item 3, `trainer.warm_start.source=rft`): the
policy's own episodes at the env's best reward, none of a held-out task, fine-tuned on before RL;
through the CLI on a TRL-style env (no demonstrate()) with the real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.rft import best_episodes
from agentrl.types import Segment, Status, Trajectory
from tests.support.interop import TINY, jsonl, one_error_line, run_cli

# A TRL-style env without demonstrations whose reward the base model reaches about half the time:
# a final reply of an even number of characters (any text will do, so sampling finds some).
ENV_MODULE = '''
class ReplyEnv:
    def reset(self, **row):
        return None

    def note(self, text: str) -> str:
        """
        Write a note.

        Args:
            text: the note
        """
        return "noted"


def even_reply(completions, **kwargs):
    return [float(len(c[-1]["content"]) % 2 == 0) for c in completions]


def never(completions, **kwargs):
    return [0.0 for _ in completions]
'''


def _traj(task_id: str, status: Status, reward: float, tokens: int = 3) -> Trajectory:
    seg = Segment(prompt_len=0)
    seg.append([1, 2], policy=False)
    if tokens:
        seg.append(list(range(tokens)), policy=True, logprobs=[0.0] * tokens, version=0)
    return Trajectory(id=f"{task_id}/0", group_id=task_id, task_id=task_id, segments=[seg], status=status,
                      outcome_reward=reward, reward=reward)


def test_best_episodes_keeps_finished_successes_of_train_tasks_only() -> None:
    trajs = [_traj("a", Status.FINISHED, 1.0), _traj("b", Status.FINISHED, 0.5),
             _traj("c", Status.ERROR, 1.0), _traj("held", Status.FINISHED, 1.0),
             _traj("d", Status.FINISHED, 1.0, tokens=0)]
    trajs.append(_traj("e", Status.FINISHED, 0.2))
    trajs[-1].reward_components = {"reward": 0.2, "success": 1.0}  # an env's own success signal wins
    assert [t.task_id for t in best_episodes(trajs, {"held"})] == ["a", "e"]


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    (tmp_path / "reply_env.py").write_text(ENV_MODULE)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"prompt": f"Say something about {w}."}) + "\n"
                                                 for w in ["cats", "rain", "tea", "maps", "bread", "kites",
                                                           "owls", "snow", "jazz", "salt"]))
    return tmp_path


def _train(env_dir: Path, reward: str, *extra: str):
    tiny = [a for a in TINY if not a.startswith(("trainer.warm_start.", "eval."))]
    return run_cli("train", "--env", "trl:reply_env:ReplyEnv", "env.kwargs.tasks=rows.jsonl",
                   f"env.kwargs.reward_funcs=[reply_env:{reward}]", "env.max_turns=1", "trainer.steps=1",
                   f"run.dir={env_dir / 'runs'}", "run.name=rft", "trainer.warm_start.enabled=true",
                   "trainer.warm_start.source=rft", "trainer.warm_start.epochs=1", *extra, *tiny, cwd=env_dir)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (the model trains); a loaded one takes several times that
def test_rft_warm_start_trains_on_the_policys_best_episodes_then_rl(env_dir: Path) -> None:
    out = _train(env_dir, "even_reply", "trainer.warm_start.tasks=4", "trainer.warm_start.rft_samples=3",
                 "eval.enabled=true", "eval.n=2")
    assert out.returncode == 0, out.stderr[-3000:]
    run = env_dir / "runs" / "rft"
    summary = json.loads((run / "summary.json").read_text())
    warm_ids = set(summary["warm_start"]["task_ids"])
    heldout = set(summary["heldout_task_ids"])
    assert heldout == {"trl/rows/4", "trl/rows/9"}  # every fifth row is held out
    assert warm_ids and not warm_ids & heldout  # the leak check: sampled on train tasks only
    assert warm_ids <= {f"trl/rows/{i}" for i in (0, 1, 2, 3)}  # the first warm_start.tasks=4 train tasks
    sft_rows = jsonl(run / "warm_start.jsonl")
    assert sft_rows and all(r["stage"] == "sft" and r["policy_tokens"] > 0 for r in sft_rows)
    assert [e["phase"] for e in jsonl(run / "eval.jsonl")] == ["base", "warm_start", "final"]
    log = (run / "train.log").read_text()
    kept, sampled = map(int, log.split("rft warm start: kept ")[1].split(" sampled")[0].split(" of "))
    assert sampled == 12 and 0 < kept < sampled  # only the episodes at the best reward are kept


def test_rft_with_nothing_at_the_best_reward_stops_with_one_line(env_dir: Path) -> None:
    out = _train(env_dir, "never", "trainer.warm_start.tasks=1", "trainer.warm_start.rft_samples=1")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    line = out.stderr.strip().splitlines()[-1]  # after the model loaded (transformers may show its progress)
    assert "none of the 1 episodes sampled on 1 train tasks" in line
    assert "raise trainer.warm_start.rft_samples" in line


@pytest.mark.parametrize(("overrides", "words"), [
    (["trainer.warm_start.source=rfx"], "trainer.warm_start.source must be demonstrations or rft, got 'rfx'"),
    (["trainer.warm_start.data=x.jsonl"], "trainer.warm_start.source=rft samples its own episodes: unset"),
])
def test_bad_rft_settings_exit_2_before_any_work(env_dir: Path, overrides: list[str], words: str) -> None:
    out = _train(env_dir, "even_reply", *overrides)
    assert out.returncode == 2
    assert words in one_error_line(out)
    assert not (env_dir / "runs").exists()


def test_an_env_without_demonstrations_names_rft_as_the_fix(env_dir: Path) -> None:
    out = run_cli("train", "--env", "trl:reply_env:ReplyEnv", "env.kwargs.tasks=rows.jsonl",
                  "env.kwargs.reward_funcs=[reply_env:even_reply]", "trainer.warm_start.enabled=true",
                  f"run.dir={env_dir / 'runs'}", cwd=env_dir)
    assert out.returncode == 2
    assert "has no demonstrations" in (line := one_error_line(out)) and "trainer.warm_start.source=rft" in line
