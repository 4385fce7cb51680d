"""Rejection-sampling fine-tuning as the warm start (`trainer.warm_start.source=rft`, issue 53).

For an env without demonstrations: the current policy plays `warm_start.rft_samples` episodes of
each of the first `warm_start.tasks` train tasks (held-out tasks never among them), through the
ordinary rollout engine at the RL sampling settings; the episodes that reach the env's best
reward (`agentrl.metrics.is_success`: a "success" component, else outcome reward >= 1) are the
warm start's data, fine-tuned on exactly as demonstrations are (agentrl/sft.py).

    trajs = await rft_trajectories(cfg, env_factory, train_tasks, tokenizer, learner, heldout_ids)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agentrl.config import Config
from agentrl.demos import DemonstrationError
from agentrl.inference import make_engine
from agentrl.inference.base import SamplingParams, all_cores
from agentrl.metrics import is_success
from agentrl.progress import status
from agentrl.rollout.engine import RolloutEngine
from agentrl.trainer.weights import weight_views
from agentrl.types import Status, Task, Trajectory

log = logging.getLogger(__name__)


def best_episodes(trajs: Iterable[Trajectory], heldout_ids: set[str]) -> list[Trajectory]:
    """The finished episodes at the env's best reward, none of a held-out task."""
    return [t for t in trajs
            if t.status is Status.FINISHED and is_success(t) and t.num_policy_tokens > 0
            and str(t.task_id) not in heldout_ids]


async def rft_trajectories(cfg: Config, env_factory: Callable[[], Any], train_tasks: Sequence[Task],
                           tokenizer: Any, learner: Any, heldout_ids: set[str] | None = None,
                           engine: Any = None) -> list[Trajectory]:
    """Sample with the learner's current weights (on `engine`, else an engine of its own, closed
    after) and keep the best episodes. DemonstrationError (one line) when none reaches the best
    reward: there is nothing to fine-tune on."""
    ws = cfg.trainer.warm_start
    heldout = heldout_ids or set()
    tasks = [t for t in train_tasks if str(t.get("id", "")) not in heldout][: ws.tasks]
    if not tasks:
        raise DemonstrationError(f"env '{cfg.env.name}' has no train tasks to sample for the rft warm start")
    own = engine is None
    engine = make_engine(cfg) if own else engine
    try:
        # Views of the learner's weights: it does not step while the warm start samples.
        load = getattr(engine, "share_weights", engine.load_weights)
        await load(weight_views(learner), learner.version)
        sampling = SamplingParams(temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                                  max_tokens=cfg.sampling.max_tokens, seed=cfg.run.seed)
        rollout = RolloutEngine(engine, tokenizer, sampling, concurrency=cfg.rollout.concurrency,
                                trajectory_timeout_s=cfg.rollout.trajectory_timeout_s,
                                max_context_tokens=cfg.rollout.max_context_tokens)
        total = len(tasks) * ws.rft_samples
        sampled: list[Trajectory] = []
        with all_cores(engine):  # nothing else computes during the warm start
            async for traj in rollout.stream(env_factory, tasks, ws.rft_samples):
                sampled.append(traj)
                status.stage = f"warm start (rft): {len(sampled)}/{total} episodes"
    finally:
        if own:
            await engine.close()
    kept = best_episodes(sampled, heldout)
    log.info("rft warm start: kept %d of %d sampled episodes (%d tasks x %d)", len(kept), len(sampled),
             len(tasks), ws.rft_samples)
    if not kept:
        raise DemonstrationError(
            f"warm start (rft): none of the {len(sampled)} episodes sampled on {len(tasks)} train tasks of env "
            f"'{cfg.env.name}' reached the best reward; raise trainer.warm_start.rft_samples or "
            "trainer.warm_start.tasks, or set trainer.warm_start.enabled=false")
    return kept
