"""Learning sanity on the real embedded model (SmolLM2-135M-Instruct): GRPO through the Learner
with the hf engine sampling and receiving the new weights each step. The verifiable reward is
1 when the answer contains "yes"; the mean reward of the last steps must clearly beat the first."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from agentrl.config import TrainerConfig
from agentrl.inference.base import SamplingParams
from agentrl.types import Group, Segment, Status, Trajectory

pytestmark = pytest.mark.slow

PROMPTS = ["Is water wet? Answer yes or no.", "Is the sun hot? Answer yes or no."]
WORD = "yes"
STEPS, GROUP, TEMPERATURE, MAX_TOKENS = int(os.environ.get("SANITY_STEPS", 6)), 8, 1.0, 12


def reward(text: str) -> float:
    return float(WORD in text.lower())


async def rollout_group(engine, tokenizer, prompt: str, step: int) -> Group:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    sampling = SamplingParams(temperature=TEMPERATURE, max_tokens=MAX_TOKENS)
    outs = await asyncio.gather(*[engine.generate(list(ids), sampling) for _ in range(GROUP)])
    trajs = []
    for j, out in enumerate(outs):
        seg = Segment(prompt_len=len(ids))
        seg.append(list(ids), policy=False)
        seg.append(out.token_ids, policy=True, logprobs=out.logprobs, version=out.version)
        r = reward(tokenizer.decode(out.token_ids, skip_special_tokens=True))
        trajs.append(Trajectory(id=f"{step}-{prompt[:8]}-{j}", group_id=f"{step}-{prompt[:8]}", task_id=prompt,
                                segments=[seg], outcome_reward=r, reward=r, status=Status.FINISHED))
    return Group(id=trajs[0].group_id, task_id=prompt, trajectories=trajs)


async def train_and_check(learner, engine, label: str) -> list[float]:
    """STEPS GRPO steps on PROMPTS, the new weights pushed to `engine` after each (merged ones for
    LoRA); asserts the engine samples what the learner recomputes (tiny rollout/trainer KL) and
    that the mean reward of the last two steps clearly beats the first two. Closes the engine."""
    curve, log = [], []
    try:
        for step in range(STEPS):
            groups = [await rollout_group(engine, engine.tokenizer, p, step) for p in PROMPTS]
            rewards = [t.reward for g in groups for t in g.trajectories]
            m = learner.step(groups)
            await engine.load_weights(learner.state_dict_for_inference(), learner.version)
            curve.append(sum(rewards) / len(rewards))
            log.append({k: round(m[k], 5) for k in ("reward_mean", "kl_k3_old_roll", "mean_abs_log_rho", "log_abs_ppl_gap", "loss",
                                                      "grad_norm", "clip_fraction", "entropy", "step_seconds")
                        if k in m})  # a step of equal-reward groups is skipped: it has no loss terms
            print(json.dumps({"step": step, **log[-1]}), flush=True)
    finally:
        await engine.close()
    trained = [e for e in log if "kl_k3_old_roll" in e]
    assert len(trained) >= STEPS // 2, log
    assert max(e["kl_k3_old_roll"] for e in trained) < 1e-3, log
    k = 2
    first, last = sum(curve[:k]) / k, sum(curve[-k:]) / k
    print(label, [round(c, 3) for c in curve], "first", first, "last", last)
    assert last > first + 0.2, curve
    return curve


@pytest.mark.parametrize("optimizer", ["adamw", "adamw8bit"])  # fp32 moments, and swe's 8-bit ones
async def test_grpo_learns_verifiable_word_on_embedded_model(optimizer: str):
    from agentrl.inference.hf import HFEngine
    from agentrl.models import resolve_model
    from agentrl.trainer.learner import Learner

    path = resolve_model("smollm2-135m")
    engine = HFEngine(path, max_batch_size=GROUP * len(PROMPTS), seed=0)
    cfg = TrainerConfig(lr=float(os.environ.get("SANITY_LR", 2e-5)), minibatches=1, micro_batch_size=16,
                        optimizer=optimizer)
    learner = Learner(path, cfg, temperature=TEMPERATURE)
    await train_and_check(learner, engine, f"curve ({optimizer})")
