"""What every layer reports the same way: whether an episode succeeded, and plain-JSON values for
the run's files (metrics.jsonl, summary.json)."""

from __future__ import annotations

from typing import Any

from agentrl.types import Trajectory


def is_success(traj: Trajectory) -> bool:
    """An env may report "success" among its reward components; otherwise a full outcome."""
    if "success" in traj.reward_components:
        return traj.reward_components["success"] >= 1.0
    return traj.outcome_reward >= 1.0


def jsonable(obj: Any) -> Any:
    """`obj` with string keys and plain values: what json.dumps takes (anything else as its repr)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return repr(obj)
