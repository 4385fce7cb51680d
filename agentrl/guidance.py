"""Demonstration guidance for groups the policy cannot solve (`trainer.demo_guidance`).

GRPO learns nothing from a group whose every trajectory failed: its rewards are equal, so every
advantage is 0 (and DAPO's dynamic sampling drops it). For a small policy those are exactly the
tasks it most needs to learn, and on a hard env (swe) they are nearly all of them. LUFFY (Yan et
al. 2025, "Learning to Reason under Off-Policy Guidance") adds an expert's trajectory to the
on-policy group, so the group has a reward spread: the expert's trajectory gets a positive
advantage, the failures a negative one.

    guide = DemoGuide(env_factory, train_tasks, tokenizer, max_tokens=..., max_context_tokens=...)
    groups = await guide(groups)  # before dynamic sampling; a group with no success gains one demo

The expert here is the env's own `demonstrate(task)`, played through the real env and rollout
engine (agentrl/demos.py), so its tokens and masks are exactly an RL rollout's. It is off-policy:
its behaviour log-probs are unknown (the teacher emits tokens, it does not sample them), so the
learner treats it as on-policy at π_prox (trainer/learner.py: ratio 1 and importance weight 1
before the update, the gradient A·∇log π of each demonstrated token). LUFFY additionally reshapes
that gradient (f(π) = π/(π+γ)) to favour low-probability tokens; agentrl does not.

A demonstration that fails (a broken `demonstrate`) leaves its group as it was: one bad expert
trajectory never ends the run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.config import Config, ConfigError
from agentrl.demos import DemonstrationError, demonstration_problem, play_demonstration
from agentrl.env import env_class_demonstrates
from agentrl.metrics import is_success
from agentrl.types import Group, Task, Trajectory

log = logging.getLogger(__name__)


def check_demo_guidance(cfg: Config) -> None:
    """trainer.demo_guidance needs an env with demonstrations; ConfigError (one line) before any work."""
    if cfg.trainer.demo_guidance and not env_class_demonstrates(cfg.env.name):
        raise ConfigError(f"trainer.demo_guidance: env '{cfg.env.name}' has no demonstrations (no demonstrate()) "
                          "to guide unsolved groups with; set trainer.demo_guidance=false")


class DemoGuide:
    """Adds one played demonstration of its task to every group with no success."""

    def __init__(self, env_factory: Callable[[], Any], tasks: Sequence[Task], tokenizer: Any, *,
                 max_tokens: int, max_context_tokens: int, timeout_s: float = 300.0) -> None:
        self.env_factory = env_factory
        self.tasks = {str(t.get("id", "")): t for t in tasks}
        self.tokenizer = tokenizer
        self.max_tokens, self.max_context_tokens, self.timeout_s = max_tokens, max_context_tokens, timeout_s
        self.played = 0  # demonstrations played (their seed: a different variant each time)
        self.failed = 0  # demonstrations that did not reach the best reward (left out)

    async def __call__(self, groups: list[Group]) -> list[Group]:
        for group in groups:
            if not group.trajectories or any(is_success(t) for t in group.trajectories):
                continue
            task = self.tasks.get(group.task_id)
            if task is None:  # not a task this guide knows (nothing to demonstrate)
                continue
            demo = await self._play(task, group)
            if demo is not None:
                group.trajectories.append(demo)
        return groups

    async def _play(self, task: Task, group: Group) -> Trajectory | None:
        seed = self.played
        self.played += 1
        try:
            traj = await play_demonstration(self.env_factory, task, self.tokenizer, seed=seed,
                                            max_tokens=self.max_tokens, max_context_tokens=self.max_context_tokens,
                                            timeout_s=self.timeout_s, version=group.version or 0)
        except DemonstrationError as e:
            problem: str | None = str(e)
        else:
            problem = demonstration_problem(traj)
        if problem is not None:
            self.failed += 1
            log.warning("demo guidance: the demonstration of task %s (seed %d) %s; group %s trains without it",
                        group.task_id, seed, problem, group.id)
            return None
        traj.id = f"{group.id}/demo{seed}"
        traj.group_id = group.id
        return traj

    def metrics(self) -> dict[str, float]:
        return {"guide_demos_played": float(self.played), "guide_demos_failed": float(self.failed)}
