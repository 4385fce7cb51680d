"""Trajectories → padded tensors: SUPO segment rows, masks for error/overlong, padding rows."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.advantages import supo_advantages
from agentrl.trainer.batch import build_batch, micro_batches
from agentrl.types import Status

from .helpers import segment, trajectory


def test_segments_become_rows_sharing_the_rollout_advantage_45():
    a1 = trajectory("a1", "A", 1.0, [segment([1, 2], [3, 4]), segment([1, 2, 9], [5]),
                                     segment([1, 2, 8], [6, 7], obs=[10, 11], response2=[12])])
    a2 = trajectory("a2", "A", 0.0, [segment([1, 2], [13, 14, 15], logprobs=[-0.1, -0.2, -0.3])])
    trajs = [a1, a2]
    group = torch.tensor([0, 0])
    adv = supo_advantages(torch.tensor([1.0, 0.0]), group, torch.tensor([False, False]))
    b = build_batch(trajs, adv, group)
    assert len(b) == 4 and b.traj_index.tolist() == [0, 0, 0, 1]
    # row 2: prompt(3) + response(2) + obs(2) + response(1) → policy positions 3,4,7
    assert b.loss_mask[2].tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    assert b.attention_mask.sum(-1).tolist() == [4, 4, 8, 5]
    torch.testing.assert_close(b.advantages[:3][b.loss_mask[:3].bool()], torch.full((6,), 0.707106), atol=1e-5, rtol=0)
    torch.testing.assert_close(b.advantages[3, 2:5], torch.full((3,), -0.707106), atol=1e-5, rtol=0)
    assert b.advantages[b.loss_mask == 0].abs().max() == 0
    torch.testing.assert_close(b.behaviour_logprobs[3, :5], torch.tensor([0, 0, -0.1, -0.2, -0.3]))
    assert b.input_ids[2].tolist() == [1, 2, 8, 6, 7, 10, 11, 12]
    assert b.token_rewards[2].tolist() == [0, 0, 0, 0, 0, 0, 0, 1.0]  # reward on the last policy token


def test_error_and_overlong_trajectories_are_masked():
    trajs = [trajectory("ok", "A", 1.0, [segment([1], [2, 3])]),
             trajectory("err", "A", 0.0, [segment([1], [4, 5])], status=Status.ERROR),
             trajectory("long", "A", 0.0, [segment([1], [6, 7])], overlong=True)]
    group = torch.zeros(3, dtype=torch.long)
    b = build_batch(trajs, torch.tensor([1.0, -1.0, -1.0]), group, drop_empty=False)
    assert b.loss_mask.sum(-1).tolist() == [2, 0, 0]
    assert b.advantages[1:].abs().max() == 0
    assert len(build_batch(trajs, torch.tensor([1.0, -1.0, -1.0]), group)) == 1  # empty rows dropped


def test_padding_rows_45_test5():
    trajs = [trajectory(f"t{i}", "A", float(i % 2), [segment([1], [2, 3])]) for i in range(13)]
    b = build_batch(trajs, torch.ones(13), torch.zeros(13, dtype=torch.long), pad_to_multiple=8)
    assert len(b) == 16
    assert b.loss_mask[13:].sum() == 0 and b.attention_mask[13:].sum() == 0
    assert b.traj_index[13:].tolist() == [-1, -1, -1]
    assert len(b.select(slice(2, 5))) == 3


def test_bad_inputs_named():
    t = trajectory("t", "A", 1.0, [segment([1], [2])])
    with pytest.raises(ValueError, match="one advantage"):
        build_batch([t], torch.ones(2), torch.zeros(1, dtype=torch.long))
    t.segments[0].logprobs.pop()
    with pytest.raises(ValueError, match="segment 0"):
        build_batch([t], torch.ones(1), torch.zeros(1, dtype=torch.long))
    bad = trajectory("p", "A", 1.0, [segment([], [2, 3])])
    with pytest.raises(ValueError, match="position 0"):
        build_batch([bad], torch.ones(1), torch.zeros(1, dtype=torch.long))


def test_micro_batches_group_rows_of_like_length_and_cap_rows_and_padded_tokens():
    rows = lambda passes: [p.tolist() for p in passes]  # noqa: E731
    assert rows(micro_batches([5, 5, 5, 5, 5], max_rows=2)) == [[0, 1], [2, 3], [4]]
    # longest first, at most 12 padded tokens a pass: 6 4 | 4 3 2 | 1
    assert rows(micro_batches([3, 4, 4, 6, 2, 1], max_rows=8, max_tokens=12)) == [[3, 1], [2, 0, 4], [5]]
    # rows of like length share a pass: in pairs [6, 1, 6, 1] computes 6 6 | 1 1 (14 padded tokens), not 24
    assert rows(micro_batches([6, 1, 6, 1], max_rows=2)) == [[0, 2], [1, 3]]
    # a row longer than the budget goes alone, and so does the next when it does not fit beside it
    assert rows(micro_batches([20, 3, 3], max_rows=4, max_tokens=10)) == [[0], [1, 2]]
    assert micro_batches([], max_rows=4, max_tokens=10) == []
    with pytest.raises(ValueError, match="max_rows"):
        micro_batches([1], max_rows=0)
