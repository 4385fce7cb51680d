"""LoRA on the learning-sanity task (test_learning_sanity.py): GRPO on the embedded model with
only rank-8 adapters trained (`trainer.lora.rank=8`), the hf engine receiving the merged weights
each step. Built as `agentrl train` builds it: config → make_learner / make_engine. The mean
reward of the last steps must clearly beat the first, as for the full fine-tune."""

from __future__ import annotations

import json
import os

import pytest

from agentrl.config import load_config
from agentrl.inference import make_engine
from agentrl.models import resolve_configured
from agentrl.trainer.distributed import make_learner

from .test_learning_sanity import GROUP, PROMPTS, STEPS, TEMPERATURE, rollout_group

pytestmark = pytest.mark.slow

LORA_LR = os.environ.get("SANITY_LORA_LR", "1e-3")


async def test_lora_grpo_learns_verifiable_word_on_embedded_model():
    cfg = load_config(None, overrides=[
        "engine.kind=hf", f"engine.max_batch_size={GROUP * len(PROMPTS)}", "run.seed=0",
        f"sampling.temperature={TEMPERATURE}", "trainer.lora.rank=8", "trainer.lora.alpha=16",
        f"trainer.lr={LORA_LR}", "trainer.minibatches=1", "trainer.micro_batch_size=16"])
    learner = make_learner(resolve_configured(cfg.model), cfg.trainer, temperature=cfg.sampling.temperature)
    assert learner.lora
    trainable = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in learner.model.parameters())
    assert trainable < 0.02 * total  # adapters only
    engine = make_engine(cfg)
    curve, log = [], []
    try:
        for step in range(STEPS):
            groups = [await rollout_group(engine, engine.tokenizer, p, step) for p in PROMPTS]
            rewards = [t.reward for g in groups for t in g.trajectories]
            m = learner.step(groups)
            await engine.load_weights(learner.state_dict_for_inference(), learner.version)  # merged
            curve.append(sum(rewards) / len(rewards))
            log.append({k: round(m[k], 5) for k in ("reward_mean", "kl_k3_old_roll", "loss", "grad_norm",
                                                      "clip_fraction", "step_seconds") if k in m})
            print(json.dumps({"step": step, **log[-1]}), flush=True)
    finally:
        await engine.close()
    trained = [e for e in log if "kl_k3_old_roll" in e]
    assert len(trained) >= STEPS // 2, log
    # the engine samples from the merged weights the learner recomputes with its adapters
    assert max(e["kl_k3_old_roll"] for e in trained) < 1e-3, log
    k = 2
    first, last = sum(curve[:k]) / k, sum(curve[-k:]) / k
    print("lora curve", [round(c, 3) for c in curve], "first", first, "last", last)
    assert last > first + 0.2, curve
