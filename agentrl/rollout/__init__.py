"""Asyncio trajectory-level rollout (architecture.md §6): token-exact multi-turn trajectories."""

from agentrl.rollout.context import ContextPolicy, context_policy_of
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.state import RolloutState, TrajectoryEnd, step_seed, trajectory_seed
from agentrl.rollout.tokens import ChatTemplateError, ChatTokens, verify_append_only

__all__ = ["ChatTemplateError", "ChatTokens", "ContextPolicy", "RolloutEngine", "RolloutState", "TrajectoryEnd",
           "context_policy_of", "step_seed", "trajectory_seed", "verify_append_only"]
