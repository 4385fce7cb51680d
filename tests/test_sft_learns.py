"""SFT on the env's demonstrations, then held-out evaluation, on the real embedded model (issue
13): the warm start raises the valid tool-call rate on a tiny held-out set. Driven through
`Stages`, the code `agentrl train` and `agentrl sft` run: base eval → warm start → eval."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import agentrl
from agentrl.config import load_config
from agentrl.models import resolve_configured
from agentrl.stages import Stages
from agentrl.trainer.learner import Learner

pytestmark = pytest.mark.slow


def test_warm_start_raises_the_valid_call_rate_on_held_out_questions(tmp_path: Path) -> None:
    cfg = load_config(env="search", overrides=[
        "env.kwargs.kinds=[language_code]", "env.max_turns=2", "sampling.max_tokens=40", "eval.n=4",
        "rollout.concurrency=4", "trainer.warm_start.tasks=8", "trainer.warm_start.per_task=2",
        "trainer.warm_start.epochs=3", "trainer.warm_start.lr=1e-4", "trainer.micro_batch_size=8", "run.quiet=true"])

    def env_factory():
        return agentrl.make("search", **cfg.env.kwargs, max_turns=cfg.env.max_turns)

    train_tasks = list(env_factory().tasks("train"))
    learner = Learner(resolve_configured(cfg.model), cfg.trainer, temperature=cfg.sampling.temperature)
    saved = []

    async def run() -> Stages:
        stages = await Stages.start(cfg, tmp_path, learner, env_factory, train_tasks)
        try:
            assert not stages.evaluator.task_ids & {t.task_id for t in stages.warm_data}  # train split only
            await stages.before_rl(saved.append)
        finally:
            await stages.close()
        return stages

    stages = asyncio.run(run())
    base, warm = stages.evaluator.records
    assert (base["phase"], warm["phase"]) == ("base", "warm_start")
    assert warm["heldout_valid_call_rate"] > base["heldout_valid_call_rate"]
    assert warm["heldout_valid_call_rate"] >= 0.75, warm
    assert saved == [{"warm_start_done": True}] and stages.warm_done
    rows = [json.loads(line) for line in (tmp_path / "warm_start.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and rows[-1]["sft_loss"] < rows[0]["sft_loss"]  # 16 demos × 3 epochs / 8
    assert len((tmp_path / "eval.jsonl").read_text().splitlines()) == 2
