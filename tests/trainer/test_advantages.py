"""Advantage estimators against the hand-computed examples of algorithms.md §4.5, §6.5, §8.1."""

from __future__ import annotations

import pytest
import torch

from agentrl.trainer.advantages import (
    broadcast_to_segments,
    drgrpo_advantages,
    group_advantages,
    grpo_advantages,
    logit_gradient_energy,
    otb_advantages,
    rloo_advantages,
    supo_advantages,
)

ATOL = 1e-5


def close(x, expected):
    torch.testing.assert_close(x.float(), torch.tensor(expected, dtype=torch.float32), atol=ATOL, rtol=0)


def test_grpo_unbiased_std_81():
    r, g = torch.tensor([1.0, 0, 0, 1]), torch.zeros(4, dtype=torch.long)
    close(grpo_advantages(r, g), [0.866024, -0.866024, -0.866024, 0.866024])


def test_drgrpo_81():
    close(drgrpo_advantages(torch.tensor([1.0, 0, 0, 1]), torch.zeros(4, dtype=torch.long)),
          [0.5, -0.5, -0.5, 0.5])


def test_all_equal_group_is_zero_and_groups_are_independent():
    r = torch.tensor([1.0, 1, 1, 1, 0, 1])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    a = grpo_advantages(r, g)
    close(a[:4], [0, 0, 0, 0])
    close(a[4:], [-0.707106, 0.707106])


def test_singleton_convention_flagged_81():
    r, g = torch.tensor([0.7]), torch.tensor([3])
    close(grpo_advantages(r, g), [0.7])  # verl: mean 0, std 1 → A = R
    close(grpo_advantages(r, g, singleton="zero"), [0.0])  # SUPO recommendation


def test_rloo_leave_one_out():
    r = torch.tensor([1.0, 0, 0, 1])
    # R_i − mean of the others: 1 − 1/3, 0 − 2/3
    close(rloo_advantages(r, torch.zeros(4, dtype=torch.long)), [2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_supo_grpo_equivalence_45_test2():
    close(group_advantages("grpo", torch.tensor([1.0, 0, 0]), torch.zeros(3, dtype=torch.long)),
          [1.154699, -0.577350, -0.577350])


def test_supo_broadcast_stats_over_rollouts_45_test1():
    # rollouts: a1 (R=1, 3 segments), a2 (R=0, 1 segment) of prompt A; b1, b2 (R=1) of prompt B
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    group = torch.tensor([0, 0, 1, 1])
    adv = supo_advantages(rewards, group, overlong=torch.zeros(4, dtype=torch.bool))
    seg_rollout = torch.tensor([0, 0, 0, 1, 2, 3])
    close(broadcast_to_segments(adv, seg_rollout), [0.707106, 0.707106, 0.707106, -0.707106, 0, 0])


def test_supo_overlong_masked_but_counted_45_test4():
    rewards = torch.tensor([1.0, 0.0, 0.0])
    adv = supo_advantages(rewards, torch.zeros(3, dtype=torch.long), overlong=torch.tensor([False, False, True]))
    # the overlong rollout's 0 still enters mean/std: same as GRPO on [1, 0, 0], then zeroed
    close(adv, [1.154699, -0.577350, 0.0])


def test_bad_inputs_named():
    with pytest.raises(ValueError, match="finite"):
        grpo_advantages(torch.tensor([1.0, float("nan")]), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="equal length"):
        grpo_advantages(torch.tensor([1.0, 0.0]), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        group_advantages("ppo", torch.tensor([1.0]), torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="outside"):
        broadcast_to_segments(torch.tensor([1.0]), torch.tensor([1]))


def _otb_toy(with_prompt_and_tool_tokens: bool):
    """algorithms.md §6.5 test 2, laid out as [N=2, T] tensors with π_old(y) and Σπ² per token."""
    pi = [[0.9, 0.5, 0.8], [0.4, 0.5]]
    sq = [[0.82, 0.38, 0.68], [0.52, 0.5]]  # Σπ² of [0.9,0.1], [0.5,0.3,0.2], [0.8,0.2], ...
    layouts = ([[1, 2, 5], [1, 3]] if with_prompt_and_tool_tokens else [[0, 1, 2], [0, 1]])
    T = 6 if with_prompt_and_tool_tokens else 3
    mask, logp, spsq, rew = (torch.zeros(2, T) for _ in range(4))
    for i, pos in enumerate(layouts):
        for j, p in enumerate(pos):
            mask[i, p], logp[i, p], spsq[i, p] = 1, torch.tensor(pi[i][j]).log(), sq[i][j]
        rew[i, pos[-1]] = [1.0, 0.0][i]  # outcome reward on the last policy token
    return rew, mask, logp, spsq, layouts


@pytest.mark.parametrize("layout", [False, True])
def test_otb_toy_group_65(layout):
    rew, mask, logp, spsq, pos = _otb_toy(layout)
    group = torch.zeros(2, dtype=torch.long)
    energy = logit_gradient_energy(logp, spsq)
    close(energy[0, pos[0]], [0.02, 0.38, 0.08])
    close(energy[1, pos[1]], [0.72, 0.50])
    adv, ret = otb_advantages(rew, mask, group, logp, spsq)
    close(ret[0, pos[0]], [1, 1, 1])
    close(adv[0, pos[0]], [0.972973, 0.753086, 0.0])
    close(adv[1, pos[1]], [-0.0270270, -0.246914])
    assert adv[mask == 0].abs().max() == 0  # prompt / tool tokens get nothing
    adv_zt, _ = otb_advantages(rew, mask, group, logp, spsq, zero_tail=True)
    close(adv_zt[0, pos[0]], [0.972973, 0.753086, 1.0])
    close(adv_zt[1, pos[1]], [-0.0270270, -0.246914])


def test_otb_single_trajectory_gets_return_and_is_weights_square():
    rew, mask, logp, spsq, _ = _otb_toy(False)
    adv, ret = otb_advantages(rew, mask, torch.tensor([0, 1]), logp, spsq)
    torch.testing.assert_close(adv, ret)
    w = torch.full_like(logp, 2.0)
    torch.testing.assert_close(logit_gradient_energy(logp, spsq, w), 4 * logit_gradient_energy(logp, spsq))
