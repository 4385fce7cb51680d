"""The supervised step: cross-entropy on the policy tokens of demonstrations or recorded
trajectories (trainer.warm_start, `agentrl sft`).

Loss mask 1 on the assistant's own tokens and its EOS; prompts, tool output and template tokens
are context. The trajectories went through the same rollout bookkeeping as RL (agentrl/demos.py),
and the step trains the Learner's own model with the Learner's optimizer, so checkpoints,
`--resume` and `agentrl eval --model RUN_DIR` work as for RL.

    rows = sft_train(learner, trajs, cfg.trainer.warm_start, on_step=print)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from agentrl.config import WarmStartConfig
from agentrl.demos import DemonstrationError
from agentrl.inference.cpu.memory import mapped_tensors
from agentrl.trainer.batch import TrainBatch, build_batch, micro_batches
from agentrl.trainer.learner import Learner
from agentrl.trainer.losses import sft_loss
from agentrl.types import Trajectory


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
