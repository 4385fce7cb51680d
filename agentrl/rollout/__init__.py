"""Asyncio trajectory-level rollout (design §6): token-exact multi-turn trajectories."""

from agentrl.rollout.engine import RolloutEngine, RolloutState, step_seed, trajectory_seed
from agentrl.rollout.tokens import ChatTemplateError, ChatTokens, verify_append_only

__all__ = ["ChatTemplateError", "ChatTokens", "RolloutEngine", "RolloutState", "step_seed",
           "trajectory_seed", "verify_append_only"]
