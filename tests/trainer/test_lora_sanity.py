"""LoRA on the learning-sanity task (test_learning_sanity.py): GRPO on the embedded model with
only rank-8 adapters trained (`trainer.lora.rank=8`), the hf engine receiving the merged weights
each step. Built as `agentrl train` builds it: config → make_learner / make_engine. The mean
reward of the last steps must clearly beat the first, as for the full fine-tune."""

from __future__ import annotations

import os

import pytest

from agentrl.config import load_config
from agentrl.inference import make_engine
from agentrl.models import resolve_configured
from agentrl.trainer.distributed import make_learner

from .test_learning_sanity import GROUP, PROMPTS, TEMPERATURE, train_and_check

pytestmark = pytest.mark.slow

LORA_LR = os.environ.get("SANITY_LORA_LR", "1e-3")


async def test_lora_grpo_learns_verifiable_word_on_embedded_model():
    cfg = load_config(None, overrides=[  # fp32 as the engine: the check below is engine = learner (KL < 1e-3)
        "trainer.dtype=float32", "engine.kind=hf", f"engine.max_batch_size={GROUP * len(PROMPTS)}", "run.seed=0",
        f"sampling.temperature={TEMPERATURE}", "trainer.lora.rank=8", "trainer.lora.alpha=16",
        f"trainer.lr={LORA_LR}", "trainer.minibatches=1", "trainer.micro_batch_size=16"])
    learner = make_learner(resolve_configured(cfg.model), cfg.trainer, temperature=cfg.sampling.temperature)
    assert learner.lora
    trainable = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in learner.model.parameters())
    assert trainable < 0.02 * total  # adapters only
    await train_and_check(learner, make_engine(cfg), "lora curve")
