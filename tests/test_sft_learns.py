"""SFT on an env's demonstrations, then held-out evaluation, on the real embedded model (issue
13): the warm start raises the valid tool-call rate on a tiny held-out set. Driven through
`Stages`, the code `agentrl train` and `agentrl sft` run: base eval → warm start → eval. The env
is a user env (short prompt, one tool) so the CPU budget stays small; it also shows a user's own
`demonstrate()` going through the same path as the built-ins'."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from agentrl import ToolEnv
from agentrl.config import load_config
from agentrl.models import load_model, resolve_configured
from agentrl.parsing import ToolCall
from agentrl.stages import Stages
from agentrl.tools import state_get, state_set, tool
from agentrl.trainer.learner import Learner

pytestmark = pytest.mark.slow

WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "pepper", "violet", "candle", "forest",
         "silver", "rocket", "garden", "planet", "winter"]


@tool(name="answer", terminal=True, inject=("state",))
async def answer(text: str, state=None) -> str:
    """Give the answer.

    Args:
        text: the word
    """
    state_set(state, "answer", text)
    return "ok"


class EchoEnv(ToolEnv):
    tools = (answer,)
    max_turns = 1

    def system_prompt(self, task):
        return "Call the tool."

    def tasks(self, split="train"):
        words = WORDS[:12] if split == "train" else WORDS[12:]
        return [{"id": f"{split}/{w}", "word": w, "half": "ab"[i % 2]} for i, w in enumerate(words)]

    def user_prompt(self, task):
        return f"Answer with the word {task['word']}."

    async def demonstrate(self, task):
        return [self.tool_parser.format_call(ToolCall("answer", {"text": task["word"]}))]

    async def reward(self, task, state):
        return float(state_get(state, "answer") == task["word"])


def test_warm_start_raises_the_valid_call_rate_on_held_out_tasks(tmp_path: Path) -> None:
    cfg = load_config(env=f"{__file__}:EchoEnv", overrides=[
        "sampling.max_tokens=32", "eval.enabled=true", "eval.n=4", "rollout.concurrency=4",
        "trainer.warm_start.enabled=true", "trainer.warm_start.tasks=8", "trainer.warm_start.per_task=1",
        "trainer.warm_start.epochs=3", "trainer.warm_start.batch_size=4", "trainer.warm_start.lr=2e-4",
        "trainer.micro_batch_size=4", "trainer.kl_coef=0.01", "trainer.warm_start.replay_coef=0.1", "eval.group_by=half", "run.quiet=true"])
    learner = Learner(resolve_configured(cfg.model), cfg.trainer, temperature=cfg.sampling.temperature)
    saved = []
    threads: list[int] = []  # the evaluation engine's torch threads, per forward

    async def run() -> Stages:
        stages = await Stages.start(cfg, tmp_path, learner, EchoEnv, EchoEnv().tasks("train"))
        try:
            assert not stages.evaluator.task_ids & {t.task_id for t in stages.warm_data}  # train split only
            stages.eval_engine.model.register_forward_pre_hook(lambda *_: threads.append(torch.get_num_threads()))
            await stages.before_rl(saved.append)
            summary = await stages.finish(step_done=0)  # the final evaluation, paired with the warm start's
            alone = set(threads)
            threads.clear()
            await stages.evaluate("step", 1)  # between RL steps rollouts may still run: the engine's own count
            assert alone == {os.cpu_count()} and set(threads) == {stages.eval_engine.num_threads}
        finally:
            await stages.close()
        return stages, summary

    stages, summary = asyncio.run(run())
    base, warm, final, _ = stages.evaluator.records
    assert (base["phase"], warm["phase"], final["phase"]) == ("base", "warm_start", "final")
    # per-task outcomes, and RL's gain (none here: no RL step) paired over the same tasks
    assert set(warm["heldout_outcomes"]) == stages.evaluator.task_ids == set(final["heldout_outcomes"])
    assert sum(warm["heldout_outcomes"].values()) == round(warm["heldout_success"] * warm["heldout_n"])
    for rec in (base, warm, final):  # eval.group_by: the same outcomes counted per value of the field
        by_half = rec["heldout_by_group"]
        assert rec["group_by"] == "half" and {g: c["n"] for g, c in by_half.items()} == {"a": 2, "b": 2}
        assert sum(c["successes"] for c in by_half.values()) == sum(rec["heldout_outcomes"].values())
    gain = summary["heldout_gain"]
    assert (gain["from"], gain["to"], gain["n"]) == ("warm_start", "final", 4)
    assert gain["ci_low"] <= gain["gain"] <= gain["ci_high"]
    # the evaluation engine ran on the learner's own parameters: no second copy of the weights
    # (under bf16 it casts the linear ones, and releases those casts when an evaluation ends)
    engine_params = dict(stages.eval_engine.model.named_parameters(remove_duplicate=False))
    views = learner.state_dict_views()
    cast = stages.eval_engine.weight_dtypes
    assert views and all(engine_params[k].data_ptr() == v.data_ptr() for k, v in views.items() if k not in cast)
    assert all(engine_params[k].numel() == 0 for k in cast)
    assert warm["heldout_valid_call_rate"] > base["heldout_valid_call_rate"], (base, warm)
    assert warm["heldout_valid_call_rate"] >= 0.75, warm
    assert saved == [{"warm_start_done": True}] and stages.warm_done
    # RL replays the warm start's sequences (replay_coef > 0): all 8, handed over as one batch
    assert learner.replay is not None and len(learner.replay) == 8 and not stages.warm_data
    # RL's KL (kl_coef > 0) regularises towards the warm-started policy, not the base model
    ref, policy = dict(learner.ref_model.named_parameters()), dict(learner.model.named_parameters())
    assert all(torch.equal(ref[k], p) for k, p in policy.items())
    base_weights = load_model(resolve_configured(cfg.model)).state_dict()
    assert any(not torch.equal(base_weights[k], p.detach()) for k, p in policy.items() if k in base_weights)
    # a new weight version, so RL's rollout engines (still on version 0) pull the warm-started weights
    assert learner.version == 1 and (base["version"], warm["version"]) == (0, 1)
    rows = [json.loads(line) for line in (tmp_path / "warm_start.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and rows[-1]["sft_loss"] < rows[0]["sft_loss"]  # 8 demos × 3 epochs / 4
    assert len((tmp_path / "eval.jsonl").read_text().splitlines()) == 4


def test_a_resumed_run_past_its_warm_start_replays_it_without_training_again(tmp_path: Path) -> None:
    cfg = load_config(env=f"{__file__}:EchoEnv", overrides=[
        "sampling.max_tokens=32", "eval.enabled=false", "trainer.warm_start.enabled=true",
        "trainer.warm_start.tasks=3", "trainer.warm_start.per_task=1", "trainer.warm_start.replay_coef=0.1",
        "run.quiet=true"])
    learner = Learner(resolve_configured(cfg.model), cfg.trainer)
    before = {k: p.detach().clone() for k, p in learner.model.named_parameters()}
    saved: list[dict] = []

    async def run() -> None:
        stages = await Stages.start(cfg, tmp_path, learner, EchoEnv, EchoEnv().tasks("train"),
                                    resumed_extra={"warm_start_done": True, "step": 2})
        try:
            await stages.before_rl(saved.append)
        finally:
            await stages.close()

    asyncio.run(run())
    assert learner.replay is not None and len(learner.replay) == 3
    assert saved == [] and learner.version == 0  # no second warm start
    assert all(torch.equal(before[k], p) for k, p in learner.model.named_parameters())


class RecordedEchoEnv(EchoEnv):
    """EchoEnv that records each episode's task and first action (the policy's own text)."""

    episodes: ClassVar[list[tuple[str, str]]] = []

    async def areset(self, task):
        self._task_id = task["id"]
        return await super().areset(task)

    async def astep(self, action):
        RecordedEchoEnv.episodes.append((self._task_id, action))
        return await super().astep(action)


def test_several_sampled_episodes_a_task_are_counted_per_task(tmp_path: Path) -> None:
    """`eval.samples=3` at T = 0.7 (avg@k): 3 episodes of each held-out task, each its own draw;
    successes per task 0..3, the rate over all 12 episodes, the interval over the 4 tasks."""
    cfg = load_config(env=f"{__file__}:RecordedEchoEnv", overrides=[
        "sampling.max_tokens=24", "eval.enabled=true", "eval.n=4", "eval.samples=3", "eval.temperature=0.7",
        "rollout.concurrency=4", "trainer.warm_start.enabled=false", "eval.group_by=half", "run.quiet=true"])
    learner = Learner(resolve_configured(cfg.model), cfg.trainer, temperature=cfg.sampling.temperature)
    RecordedEchoEnv.episodes.clear()

    async def run() -> dict:
        stages = await Stages.start(cfg, tmp_path, learner, RecordedEchoEnv, [])
        try:
            return await stages.evaluate("base", 0)
        finally:
            await stages.close()

    rec = asyncio.run(run())
    tasks = sorted({t for t, _ in RecordedEchoEnv.episodes})
    assert len(tasks) == 4 and sorted(t for t, _ in RecordedEchoEnv.episodes) == sorted(tasks * 3)
    actions = {t: [a for u, a in RecordedEchoEnv.episodes if u == t] for t in tasks}
    assert any(len(set(a)) > 1 for a in actions.values()), actions  # sampled, not one greedy episode thrice
    assert (rec["heldout_n"], rec["heldout_samples"]) == (4, 3) and set(rec["heldout_outcomes"]) == set(tasks)
    assert all(0 <= c <= 3 for c in rec["heldout_outcomes"].values())
    assert sum(rec["heldout_outcomes"].values()) == round(rec["heldout_success"] * 12)
    assert {g: c["n"] for g, c in rec["heldout_by_group"].items()} == {"a": 6, "b": 6}
    assert 0.0 <= rec["heldout_ci_low"] <= rec["heldout_success"] <= rec["heldout_ci_high"] <= 1.0
    saved = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert saved == [rec]
