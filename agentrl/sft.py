"""Supervised warm start: `agentrl sft` and `trainer.warm_start` (issue 13).

Cross-entropy on the policy tokens only (loss mask 1: the assistant's own tokens and its EOS;
prompts, tool output and template tokens are context), on trajectories that went through the
same rollout bookkeeping as RL (agentrl/demos.py). It trains the Learner's own model with the
Learner's optimizer, so checkpoints, `--resume` and `agentrl eval --model RUN_DIR` work as for RL.

    trajs = await warm_start_data(cfg, env_factory, tasks, tokenizer)
    rows = sft_train(learner, trajs, cfg.trainer.warm_start, on_step=print)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from agentrl.config import Config, ConfigError, WarmStartConfig
from agentrl.demos import DemonstrationError, collect_demonstrations, trajectories_from_jsonl
from agentrl.env import env_class_demonstrates
from agentrl.heap import mapped_tensors
from agentrl.trainer.batch import TrainBatch, build_batch, micro_batches
from agentrl.trainer.learner import Learner
from agentrl.trainer.losses import sft_loss
from agentrl.types import Task, Trajectory

log = logging.getLogger(__name__)


def sft_batch(trajectories: Sequence[Trajectory]) -> TrainBatch:
    """One row per segment, loss mask = the policy tokens (the RL batch layout, advantage 0)."""
    n = len(trajectories)
    return build_batch(list(trajectories), torch.zeros(n), torch.arange(n))


def sft_train(learner: Any, trajectories: Sequence[Trajectory], ws: WarmStartConfig, *,
              micro_batch_size: int | None = None, on_step: Callable[[dict[str, Any]], Any] | None = None,
              should_stop: Callable[[], bool] | None = None) -> list[dict[str, Any]]:
    """`ws.epochs` passes over the trajectories in seeded shuffles of `ws.batch_size` rows, one
    AdamW step each at `ws.lr` (the RL schedule is left untouched); the optimizer's moments are
    cleared afterwards so RL starts from a fresh optimizer. Returns one metrics dict per step.
    `learner` is a `Learner` or a `DistributedLearner` (trainer.num_learners > 1: every rank runs
    `sft_steps` on its FSDP2 shard, each forwarding its own micro-batches)."""
    batch = sft_batch(trajectories)
    if len(batch) == 0:
        raise DemonstrationError("the warm-start data holds no policy tokens to train on")
    steps = (learner.sft_steps(batch, ws, micro_batch_size) if hasattr(learner, "sft_steps")
             else sft_steps(learner, batch, ws, micro_batch_size))
    rows: list[dict[str, Any]] = []
    try:
        # the steps' activations and gradients do not fragment the heap (at ws.mmap_threshold_mb and up)
        with mapped_tensors(int(ws.mmap_threshold_mb * 2**20)):
            for row in steps:
                rows.append(row)
                if on_step is not None:
                    on_step(row)
                if should_stop is not None and should_stop():
                    break
    finally:
        steps.close()  # restores the RL learning rate, clears the moments, bumps the version
    return rows


def _policy_logprobs(learner: Learner, mb: TrainBatch) -> Tensor:
    """log π of the policy tokens at temperature 1, through the learner's own forward (the FSDP2
    root on a sharded learner), under the RL forward's autocast (`trainer.dtype`)."""
    return learner._forward(learner.model, mb, entropy=False, sum_pi_sq=False, temperature=1.0).logprobs


def sft_steps(learner: Learner, batch: TrainBatch, ws: WarmStartConfig,
              micro_batch_size: int | None = None) -> Iterator[dict[str, Any]]:
    """The warm start one optimizer step at a time (one metrics dict each); closing the generator
    early (Ctrl-C) or finishing it restores the RL learning rate and clears the Adam moments.
    Data parallel over `learner.world` ranks: rank r forwards micro-batches r, r+N, ... (every
    rank as many forwards, FSDP2's collectives need it) and FSDP averages the gradients."""
    micro = micro_batch_size or learner.cfg.micro_batch_size
    model, optimizer = learner.model, learner.optimizer
    rank, world = learner.rank, learner.world
    saved_lr = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = ws.lr
    done = 0
    t_start = time.perf_counter()
    model.train()
    try:
        for epoch in range(ws.epochs):
            order = torch.randperm(len(batch), generator=learner.generator)
            for chunk in order.split(ws.batch_size):
                t0 = time.perf_counter()
                step = batch.select(chunk)
                n_policy = float(step.loss_mask.sum())
                passes = micro_batches(step.attention_mask.sum(-1).tolist(), micro, learner.cfg.micro_batch_tokens)
                mine = passes[rank::world]
                total = 0.0
                for i in range(-(-len(passes) // world)):
                    real = i < len(mine)
                    mb = learner._trim(step.select(mine[i] if real else passes[0]))  # drop padding columns
                    loss = sft_loss(_policy_logprobs(learner, mb).float().cpu(), mb.loss_mask, n_policy)
                    # FSDP averages gradients over ranks; the divisor already counts the whole step
                    (loss * (world if real else 0.0)).backward()
                    total += loss.item() if real else 0.0
                total = learner._all_reduce(torch.tensor(total, dtype=torch.float64)).item()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), learner.cfg.grad_clip)
                if hasattr(grad_norm, "full_tensor"):  # sharded (FSDP2) parameters: a DTensor norm
                    grad_norm = grad_norm.full_tensor()
                if not torch.isfinite(grad_norm):
                    optimizer.zero_grad(set_to_none=True)
                    raise FloatingPointError(f"non-finite gradient norm in the warm start (lr {ws.lr})")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                learner.global_step += 1
                elapsed = time.perf_counter() - t0
                done += 1
                yield {"step": done - 1, "stage": "sft", "epoch": epoch, "loss": total, "sft_loss": total,
                       "perplexity": math.exp(min(total, 50.0)), "grad_norm": grad_norm.item(),
                       "policy_tokens": int(n_policy), "num_tokens": step.num_tokens,
                       "tokens_per_s": step.num_tokens / elapsed if elapsed > 0 else None,
                       "sft_step_s": elapsed, "wall_s": time.perf_counter() - t_start}
    finally:
        for g, lr in zip(optimizer.param_groups, saved_lr):
            g["lr"] = lr
        optimizer.state.clear()  # RL's Adam moments start fresh, not scaled by SFT gradients
        if done:  # new weights, a new version: rollout engines still on the old one pull these
            learner.version += 1


def check_warm_start(cfg: Config) -> None:
    """What can be checked before any work: a data file that exists, or an env with
    demonstrations. Raises ConfigError (one line)."""
    from pathlib import Path

    ws = cfg.trainer.warm_start
    if not ws.enabled:
        return
    if ws.data is not None:
        if not Path(ws.data).is_file():
            raise ConfigError(f"trainer.warm_start.data: no such file {ws.data} (a JSONL of trajectories, e.g. "
                              "an earlier run's trajectories.jsonl)")
        from agentrl.demos import check_trajectory_file

        check_trajectory_file(ws.data)  # every line's schema, before the model loads
        return
    if not env_class_demonstrates(cfg.env.name):
        raise ConfigError(f"trainer.warm_start: env '{cfg.env.name}' has no demonstrations (no demonstrate()); "
                          "set trainer.warm_start.data=FILE.jsonl or trainer.warm_start.enabled=false")


async def warm_start_data(cfg: Config, env_factory: Callable[[], Any], train_tasks: Sequence[Task],
                          tokenizer: Any, heldout_ids: set[str] | None = None) -> list[Trajectory]:
    """The warm-start trajectories: recorded ones from `warm_start.data` (filtered by reward),
    else demonstrations of the first `warm_start.tasks` train tasks. Held-out task ids are never
    included. Raises DemonstrationError (one line) when there is nothing good to train on."""
    ws = cfg.trainer.warm_start
    heldout = heldout_ids or set()
    if ws.data is not None:
        trajs = trajectories_from_jsonl(ws.data, tokenizer, ws.min_reward, exclude_task_ids=heldout)
        if not trajs:
            raise DemonstrationError(f"{ws.data}: no trajectory with reward >= {ws.min_reward} and policy tokens; "
                                     "lower trainer.warm_start.min_reward or record more trajectories")
        return trajs
    tasks = [t for t in train_tasks if str(t.get("id", "")) not in heldout][: ws.tasks]
    if not tasks:
        raise DemonstrationError(f"env '{cfg.env.name}' has no train tasks to demonstrate")
    trajs = await collect_demonstrations(
        env_factory, tasks, tokenizer, per_task=ws.per_task, max_tokens=max(cfg.sampling.max_tokens, 4096),
        max_context_tokens=cfg.rollout.max_context_tokens, concurrency=max(1, cfg.sandbox.pool_size),
        timeout_s=cfg.rollout.trajectory_timeout_s)
    # Longer than a turn may be: still worth imitating (the format), but RL will cut such turns.
    longest = max((t.action_end - t.action_start for tr in trajs for s in tr.segments for t in s.turns), default=0)
    if longest > cfg.sampling.max_tokens:
        log.warning("a demonstration action has %d tokens, more than sampling.max_tokens=%d: the policy "
                    "cannot produce it in one turn; raise sampling.max_tokens", longest, cfg.sampling.max_tokens)
    return trajs


# ---------------------------------------------------------------------------------------------
# `agentrl sft`
# ---------------------------------------------------------------------------------------------


def prepare_sft(env: str | None, config_file: str | None = None, overrides: list[str] | None = None,
                data: str | None = None) -> Any:
    """A RunPlan for an SFT-only run (`runs/sft-<env>-<model>-<time>/`); ConfigError before any work."""
    from agentrl.run import prepare_run

    overrides = [*(overrides or []), "trainer.warm_start.enabled=true"]
    if data is not None:
        overrides.append(f"trainer.warm_start.data={data}")
    plan = prepare_run(env, config_file, overrides)
    if plan.config.run.name is None:
        plan.run_dir = plan.run_dir.with_name(f"sft-{plan.run_dir.name}")
    return plan


def run_sft(plan: Any) -> int:
    """SFT on the env's demonstrations (or the data file), with held-out evaluations before and
    after when `eval.enabled`. The run directory has the layout of a training run; its checkpoint
    records the warm start as done, so `agentrl train --resume RUN_DIR` continues with RL."""
    import asyncio
    import logging

    from agentrl.config import dump_config

    plan.run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=plan.run_dir / "train.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    (plan.run_dir / "config.yaml").write_text(dump_config(plan.config))
    return asyncio.run(_run_sft(plan))


async def _run_sft(plan: Any) -> int:
    import json

    from agentrl.models import resolve_configured
    from agentrl.report import write_report
    from agentrl.run import _jsonable, make_env
    from agentrl.sandboxes import make_pool
    from agentrl.stages import Stages
    from agentrl.trainer.checkpoint import save_checkpoint
    from agentrl.trainer.distributed import make_learner

    cfg, run_dir = plan.config, plan.run_dir
    learner = make_learner(resolve_configured(cfg.model), cfg.trainer, temperature=cfg.sampling.temperature,
                           reward_cfg=cfg.reward)
    pool = make_pool(cfg.sandbox, run_id=run_dir.name, name=f"{cfg.env.name}-sft")
    await pool.start()
    stages = None
    try:
        probe = make_env(cfg, pool)
        tasks = list(probe.tasks("train"))
        await probe.aclose()
        stages = await Stages.start(cfg, run_dir, learner, lambda: make_env(cfg, pool), tasks)
        stages.sft_file = "metrics.jsonl"
        await stages.before_rl(lambda more: save_checkpoint(run_dir / "checkpoints", learner,
                                                            extra={"step": 0, **more}))
        summary = await stages.finish(0, final_eval=False)
        (run_dir / "summary.json").write_text(json.dumps(_jsonable(summary), indent=1))
    finally:
        if stages is not None:
            await stages.close()
        await pool.close()
        if hasattr(learner, "close"):  # trainer.num_learners > 1: the rank processes
            learner.close()
    report = write_report(run_dir)
    print(f"[agentrl] run directory: {run_dir}  report: {report / 'index.html'}")
    return 0
