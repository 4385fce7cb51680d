"""Demonstrations (issue 13): every built-in env's demonstrations reach its best reward through
the real env, real bubblewrap sandboxes and the real rollout engine; the policy-token mask of a
demonstration is exactly the assistant's own tokens on the real chat template; recorded
trajectories rebuild the same tokens; bad input stops with one line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

import agentrl
from agentrl.config import ConfigError, load_config
from agentrl.demos import (
    DemonstrationError,
    check_warm_start,
    collect_demonstrations,
    play_demonstration,
    trajectories_from_jsonl,
)
from agentrl.env import has_demonstrations
from agentrl.metrics import is_success
from agentrl.models import load_tokenizer, resolve_model
from agentrl.run import readable_trajectory
from agentrl.trainer.losses import sft_loss
from agentrl.trainer.sft import sft_batch
from agentrl.types import Status


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model("smollm2-135m"))


def _tasks(name: str, n: int, **kwargs):
    env = agentrl.make(name, **kwargs)
    try:
        return list(env.tasks("train"))[:n]
    finally:
        env.close()


def _collect(name: str, tasks, tok, per_task: int = 1, **kwargs):
    return asyncio.run(collect_demonstrations(lambda: agentrl.make(name, **kwargs), tasks, tok, per_task=per_task,
                                              max_tokens=512))


def test_code_demonstrations_pass_the_hidden_tests_in_bwrap_in_every_variant(tok) -> None:
    tasks = _tasks("code", 5, difficulty=1)
    trajs = _collect("code", tasks, tok, per_task=3, difficulty=1)
    assert len(trajs) == 15 and all(is_success(t) and t.status is Status.FINISHED for t in trajs)
    assert all(t.reward_components["implicit_submit"] == 0.0 for t in trajs)  # real tool calls
    assert {t.num_turns for t in trajs} == {1, 2}  # variants: test first, or submit at once
    assert any("python" in str(t.messages) and t.num_turns == 2 for t in trajs)


def test_search_demonstrations_answer_every_question_kind(tok) -> None:
    env = agentrl.make("search")
    by_kind = {}
    for t in env.tasks("train"):
        by_kind.setdefault(t["kind"], t)
    trajs = _collect("search", list(by_kind.values()), tok, per_task=2)
    assert len(trajs) == 2 * len(by_kind) >= 10 and all(is_success(t) for t in trajs)
    multi = [t for t in trajs if t.task["hops"] == 2]
    assert multi and all(any(m.get("name") == "open" for m in t.messages) for t in multi)  # the linked record
    queries = {json.loads(t.messages[2]["content"].split("<tool_call>")[1].split("</tool_call>")[0])
               ["arguments"]["query"] for t in trajs}
    assert len(queries) > len(by_kind)  # paraphrased across seeds


def test_swe_demonstrations_fix_the_bug_within_max_turns(tok) -> None:
    tasks = _tasks("swe", 1, max_turns=6)
    trajs = _collect("swe", tasks, tok, per_task=2, max_turns=6)
    assert len(trajs) == 2 and all(t.outcome_reward == 1.0 and t.reward_components["resolved"] == 1.0 for t in trajs)
    assert all(t.num_turns <= 6 for t in trajs)
    names = [m.get("name") for m in trajs[0].messages if m["role"] == "tool"]
    assert names[0] == "bash" and "str_replace_editor" in names and names[-1] == "submit"
    short = _collect("swe", tasks[:1], tok, max_turns=2)  # exploration dropped to fit the turn budget
    assert short[0].num_turns <= 2 and is_success(short[0])


def test_summarize_delegates_demonstrations_to_the_inner_env(tok) -> None:
    from agentrl.envs.summarize import SummarizeEnv

    def factory():
        return SummarizeEnv(agentrl.make("code"), working_context=4096)

    assert has_demonstrations(factory())
    task = _tasks("code", 1)[0]
    traj = asyncio.run(play_demonstration(factory, task, tok, max_tokens=512))
    assert is_success(traj)


def test_policy_mask_is_exactly_the_actions_and_their_eos(tok) -> None:
    task = _tasks("search", 1)[0]
    traj = asyncio.run(play_demonstration(lambda: agentrl.make("search"), task, tok, seed=1))
    (seg,) = traj.segments
    actions = [m["content"] for m in traj.messages if m["role"] == "assistant"]
    masked = [i for i, m in enumerate(seg.loss_mask) if m]
    runs, start = [], masked[0]  # contiguous masked runs, one per action
    for a, b in zip(masked, [*masked[1:], None]):
        if b != a + 1:
            runs.append(seg.token_ids[start:a + 1])
            start = b
    assert [tok.decode(r) for r in runs] == [f"{a}<|im_end|>" for a in actions]
    # The whole context is what the chat template renders for the conversation, token for token.
    rendered = tok.apply_chat_template(traj.messages[:-1], tokenize=False)
    assert tok.decode(seg.token_ids) == rendered.rstrip("\n")
    # The loss sees exactly these positions: log-probs elsewhere do not move it.
    batch = sft_batch([traj])
    lp = -torch.rand(batch.input_ids.shape)
    base = sft_loss(lp, batch.loss_mask)
    lp2 = lp.clone()
    lp2[batch.loss_mask == 0] -= 5.0
    assert torch.equal(sft_loss(lp2, batch.loss_mask), base)
    lp2[batch.loss_mask == 1] -= 1.0
    assert torch.allclose(sft_loss(lp2, batch.loss_mask), base + 1.0)


def test_recorded_transcripts_rebuild_the_rollout_tokens_and_filter_by_reward(tok, tmp_path: Path) -> None:
    tasks = _tasks("code", 2)
    good, other = _collect("code", tasks, tok)
    other.reward = 0.0
    path = tmp_path / "trajectories.jsonl"
    path.write_text(readable_trajectory(good, 0) + "\n" + readable_trajectory(other, 0) + "\n"
                    + json.dumps(other.to_dict()) + "\n")
    kept = trajectories_from_jsonl(path, tok, min_reward=1.0)
    assert len(kept) == 1 and kept[0].task_id == good.task_id
    assert kept[0].segments[0].token_ids == good.segments[0].token_ids
    assert kept[0].segments[0].loss_mask == good.segments[0].loss_mask
    assert len(trajectories_from_jsonl(path, tok, min_reward=None)) == 3
    assert trajectories_from_jsonl(path, tok, None, exclude_task_ids={good.task_id, other.task_id}) == []


@pytest.mark.parametrize("line, words", [
    ('{"prompt": "x", "completion": "y"}', "lacks 'messages', 'reward'"),
    ("not json", "is not JSON"),
    ('{"messages": [{"content": "x"}], "reward": 1}', "'messages' must be a list of chat messages"),
    ('{"messages": [], "reward": "high"}', "'reward' must be a number"),
])
def test_a_jsonl_of_the_wrong_schema_names_the_line(tok, tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("\n" + line + "\n")
    with pytest.raises(DemonstrationError, match="line 2") as e:
        trajectories_from_jsonl(path, tok)
    assert words in str(e.value) and "\n" not in str(e.value)


class _NoDemos(agentrl.ToolEnv):
    tools = (agentrl.tools.submit,)

    def tasks(self, split="train"):
        return [{"id": "0", "prompt": "submit"}]

    async def reward(self, task, state):
        return 1.0


class _BadDemos(_NoDemos):
    async def demonstrate(self, task):
        return ["no tool call here"]


def test_a_user_env_without_demonstrations_still_works_and_a_warm_start_needs_data(tok) -> None:
    env = _NoDemos()
    assert not has_demonstrations(env)
    env.reset()
    assert env.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')[2]
    env.close()
    with pytest.raises(DemonstrationError, match="has no demonstrations"):
        asyncio.run(collect_demonstrations(_NoDemos, _NoDemos().tasks(), tok))
    cfg = load_config(env=f"{__file__}:_NoDemos", overrides=["trainer.warm_start.enabled=true"])
    with pytest.raises(ConfigError, match="has no demonstrations"):
        check_warm_start(cfg)


def test_a_failing_demonstration_stops_with_one_line(tok) -> None:
    with pytest.raises(DemonstrationError) as e:
        asyncio.run(collect_demonstrations(_BadDemos, _BadDemos().tasks(), tok))
    msg = str(e.value)
    assert "demonstration of task 0" in msg and "went on after" in msg and "\n" not in msg


def test_env_check_plays_demonstrations_and_fails_on_a_bad_one() -> None:
    from agentrl.envcheck import check_env

    def status(report):
        return {c.name: c.status for c in report.checks}.get("demonstrations reach the best reward")

    assert status(check_env(_NoDemos())) is None  # optional: not checked, not counted
    bad = check_env(_BadDemos())
    assert status(bad) == "fail" and not bad.ok
    assert "went on after" in next(c.detail for c in bad.checks if c.name.startswith("demonstrations"))
    assert status(check_env("search")) == "pass"


@pytest.mark.parametrize("args, words", [
    (["--env", f"{__file__}:_NoDemos"], "has no demonstrations"),
    (["--env", "code", "--data", "/nonexistent/trajectories.jsonl"], "no such file"),
    (["--env", "code", "--data", "{bad}"], "line 1 lacks 'messages', 'reward'"),
])
def test_sft_cli_bad_input_is_one_line_before_any_training(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                           args: list[str], words: str) -> None:
    from agentrl.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "completion": "c"}\n')
    argv = ["sft", *[a.replace("{bad}", str(bad)) for a in args], f"run.dir={tmp_path / 'runs'}", "run.name=r",
            "eval.enabled=false", "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agentrl sft: ") and words in err[0], err
    assert not list((tmp_path / "runs").glob("*/checkpoints/*"))  # nothing was trained
