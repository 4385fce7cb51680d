"""Trainer: pure losses/advantages/rewards, batch building, the learner and checkpoints (architecture.md §8)."""

from agentrl.trainer.batch import TrainBatch, build_batch
from agentrl.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentrl.trainer.learner import Learner
from agentrl.trainer.logprobs import TokenStats, token_logprobs, token_logprobs_and_stats

__all__ = ["Learner", "TokenStats", "TrainBatch", "build_batch", "latest_checkpoint", "load_checkpoint",
           "save_checkpoint", "token_logprobs", "token_logprobs_and_stats"]
