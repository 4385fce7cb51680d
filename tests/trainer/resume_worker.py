"""Train a tiny Llama for a few global batches, optionally resuming from / saving a checkpoint.

Run in a fresh process by test_checkpoint.py:
    python -c "from tests.trainer.resume_worker import main; main()" STEPS RESUME_FROM|- SAVE_DIR|- OUT
"""

from __future__ import annotations

import random
import sys

import numpy as np
import torch

from agentrl.config import TrainerConfig
from agentrl.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentrl.trainer.learner import Learner

from .conftest import VOCAB, tiny_llama
from .helpers import random_groups

CFG = TrainerConfig(lr=1e-3, minibatches=2, micro_batch_size=3, warmup_steps=3, weight_decay=0.01)


def train(steps: int, resume_dir: str | None, save_dir: str | None) -> Learner:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    learner = Learner(tiny_llama(0), CFG)
    cursor = 0
    if resume_dir:
        cursor = load_checkpoint(latest_checkpoint(resume_dir), learner)["cursor"]
    for _ in range(steps):
        # Data depends on the global RNGs and the cursor, so both must be restored exactly.
        seed = random.randint(0, 10**6) + int(np.random.randint(0, 1000)) + int(torch.randint(0, 1000, (1,)))
        learner.step(random_groups(2, 3, VOCAB, seed=seed + cursor))
        cursor += 1
    if save_dir:
        save_checkpoint(save_dir, learner, extra={"cursor": cursor})
    return learner


def main() -> None:
    steps, resume, save, out = sys.argv[1:5]
    learner = train(int(steps), None if resume == "-" else resume, None if save == "-" else save)
    torch.save({k: v.clone() for k, v in learner.model.state_dict().items()} | {"__step": learner.global_step}, out)
