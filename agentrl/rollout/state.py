"""What the rollout engine and the agent-program runner share: the per-step sampling seed, a
trajectory's resumable state, and the signal that ends a trajectory. Both drive episodes on it
(agentrl/rollout/engine.py for envs, agentrl/endpoint/agent.py for agent programs), so it sits
below them both."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from agentrl.types import Message, Status, Trajectory


def step_seed(seed: int | None, step: int) -> int | None:
    """The sampling seed of a trajectory's `step`-th generation: a pure function of the
    trajectory seed and the step, so a resumed trajectory draws exactly what it would have."""
    return None if seed is None else (seed * 1_000_003 + step) % 2**31


def trajectory_seed(base: int | None, traj_id: str) -> int | None:
    """A per-trajectory seed from the sampling seed and the (deterministic) trajectory id."""
    return None if base is None else zlib.crc32(f"{base}:{traj_id}".encode()) % 2**31


@dataclass
class RolloutState:
    """A trajectory paused at a turn boundary: everything needed to continue it elsewhere.

    `env` is the live env object (moves within a process). Across processes `to_dict()` drops
    it; `resume` then rebuilds the env from a factory by `areset(task)` and replaying
    `actions` in order (an env is deterministic given its actions)."""

    trajectory: Trajectory  # segments, messages, rewards and timings so far
    prompt: list[Message]  # s_1, the initial messages (a context policy may restart from them)
    context: list[Message]  # the current segment's conversation, for template deltas
    actions: list[str] = field(default_factory=list)  # every action sent to env.astep
    step: int = 0  # policy generations so far (actions + compactions): the step limit and the seed step
    seed: int | None = None  # trajectory sampling seed (None: engine randomness)
    env: Any = None

    @property
    def turn(self) -> int:
        return len(self.actions)

    def to_dict(self) -> dict[str, Any]:
        return {"trajectory": self.trajectory.to_dict(), "prompt": [dict(m) for m in self.prompt],
                "context": [dict(m) for m in self.context], "actions": list(self.actions),
                "step": self.step, "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RolloutState:
        return cls(trajectory=Trajectory.from_dict(d["trajectory"]), prompt=d["prompt"],
                   context=d["context"], actions=list(d["actions"]), step=d["step"], seed=d["seed"])


class TrajectoryEnd(Exception):
    """Raised by whatever drives a trajectory to end it with `status`. `reason` names why a
    trajectory was truncated (kept in traj.metrics as `truncated_<reason>` = 1)."""

    def __init__(self, status: Status, reason: str = "", overlong: bool = False) -> None:
        super().__init__(reason)
        self.status, self.reason, self.overlong = status, reason, overlong
