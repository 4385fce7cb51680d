"""Trajectories → padded training tensors (one row per segment; SUPO, algorithms.md §4.2).

Every segment of a trajectory becomes its own row sharing the trajectory's scalar advantage
(§4.2 Thm. 3.2). A row's loss mask is the segment's policy-token mask, zeroed when the trajectory
is not trainable (status error/aborted) or overlong (SUPO/DAPO overlong filtering, §9 step 5).
Rows are right-padded; `pad_rows` adds all-zero rows for micro-batching (§4.5 test 5).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from agentrl.types import Trajectory


@dataclass
class TrainBatch:
    """[N, T] token tensors and [N] row tensors. Padding positions and rows have masks 0."""

    input_ids: Tensor  # long
    attention_mask: Tensor  # long, 1 on real tokens
    loss_mask: Tensor  # float, 1 on trainable policy tokens
    behaviour_logprobs: Tensor  # float, log π_roll from the inference engine
    advantages: Tensor  # float, per token (scalar rollout advantage broadcast, or OTB)
    token_rewards: Tensor  # float, the trajectory reward on the row's last policy token (OTB)
    traj_index: Tensor  # long [N], index into the trajectory list; -1 for padding rows
    group_index: Tensor  # long [N], group of the row's trajectory; -1 for padding rows
    demonstrated: Tensor  # bool [N], an expert's row (no behaviour log-probs; agentrl/guidance.py)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def select(self, rows: Tensor | slice) -> TrainBatch:
        """The sub-batch of the given rows (index tensor or slice)."""
        return TrainBatch(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    def pad_rows(self, multiple: int) -> TrainBatch:
        """Append all-zero rows (mask 0, index −1) until len is a multiple of `multiple`."""
        if multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {multiple}")
        extra = -len(self) % multiple
        if extra == 0:
            return self
        out = {}
        for f in fields(self):
            x = getattr(self, f.name)
            fill = -1 if f.name in ("traj_index", "group_index") else 0
            out[f.name] = torch.cat([x, x.new_full((extra, *x.shape[1:]), fill)])
        return TrainBatch(**out)


def micro_batches(lengths: list[int], max_rows: int, max_tokens: int = 0) -> list[Tensor]:
    """Row indices of each forward pass (gradients accumulate over them): longest rows first, so
    that rows of like length share a pass and little padding is computed (a pass costs its rows ×
    its longest row: 4 rows of 1000/900/700/500 tokens padded together take 16.8 s of bf16 forward +
    backward on this CPU, by length 14.1 s); at most `max_rows` rows, and with `max_tokens` > 0 at
    most that many padded tokens, since activation memory grows with the padded size. A row longer
    than the budget goes alone. The order within a mini-batch changes only the summation order."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    for i in order:  # each pass's first row is its longest
        if out and len(out[-1]) < max_rows and (max_tokens <= 0 or (len(out[-1]) + 1) * lengths[out[-1][0]] <= max_tokens):
            out[-1].append(i)
        else:
            out.append([i])
    return [torch.tensor(rows, dtype=torch.long) for rows in out]


def trajectory_is_trained(traj: Trajectory) -> bool:
    """Trainable status and not overlong (overlong ones still count in group statistics)."""
    return traj.status.trainable and not traj.overlong


def build_batch(trajectories: list[Trajectory], rollout_advantages: Tensor, group_index: Tensor,
                pad_to_multiple: int = 1, drop_empty: bool = True) -> TrainBatch:
    """One row per segment; rollout_advantages[i] (scalar) is broadcast to every policy token of
    every segment of trajectories[i]; group_index[i] is its group.

    drop_empty: skip rows with no trainable token (masked trajectories, segments without policy
    tokens) — they contribute nothing to the loss or its divisors, only compute."""
    if rollout_advantages.shape != (len(trajectories),) or group_index.shape != (len(trajectories),):
        raise ValueError(f"need one advantage and one group index per trajectory ({len(trajectories)}), got "
                         f"{tuple(rollout_advantages.shape)} and {tuple(group_index.shape)}")
    rows: list[tuple[int, list[int], list[int], list[float]]] = []
    for i, traj in enumerate(trajectories):
        trained = trajectory_is_trained(traj)
        for k, seg in enumerate(traj.segments):
            try:
                seg.check()
            except ValueError as e:
                raise ValueError(f"trajectory {traj.id} segment {k}: {e}") from None
            mask = [m if trained else 0 for m in seg.loss_mask]
            if drop_empty and not any(mask):
                continue
            rows.append((i, seg.token_ids, mask, seg.logprobs))
    width = max((len(r[1]) for r in rows), default=1)
    n = len(rows)
    input_ids = torch.zeros(n, width, dtype=torch.long)
    attention_mask = torch.zeros(n, width, dtype=torch.long)
    loss_mask = torch.zeros(n, width)
    behaviour = torch.zeros(n, width)
    token_rewards = torch.zeros(n, width)
    traj_index = torch.tensor([r[0] for r in rows], dtype=torch.long)
    for j, (i, ids, mask, logprobs) in enumerate(rows):
        length = len(ids)
        input_ids[j, :length] = torch.tensor(ids, dtype=torch.long)
        attention_mask[j, :length] = 1
        loss_mask[j, :length] = torch.tensor(mask, dtype=torch.float)
        behaviour[j, :length] = torch.tensor(logprobs, dtype=torch.float)
        policy = loss_mask[j].nonzero()
        if len(policy):
            token_rewards[j, int(policy[-1])] = trajectories[i].reward
    if loss_mask[:, :1].any():
        raise ValueError("a policy token at position 0 has no context to be predicted from")
    adv = rollout_advantages.float()[traj_index].unsqueeze(-1) * loss_mask if n else torch.zeros(0, width)
    demonstrated = torch.tensor([trajectories[r[0]].demonstrated for r in rows], dtype=torch.bool)
    batch = TrainBatch(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask,
                       behaviour_logprobs=behaviour, advantages=adv, token_rewards=token_rewards,
                       traj_index=traj_index, group_index=group_index[traj_index] if n else traj_index,
                       demonstrated=demonstrated)
    return batch.pad_rows(pad_to_multiple)
