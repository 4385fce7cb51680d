"""G-RA, D-RA, overlong shaping and dynamic sampling against algorithms.md §3.5 and §5.4."""

from __future__ import annotations

import pytest

from agentrl.trainer.rewards import (
    DynamicSampler,
    filter_groups,
    g_ra,
    gated_accumulation,
    has_reward_variance,
    overlong_penalty,
)


@pytest.mark.parametrize("outcome,steps,gra,dra", [
    (-0.5, [0.1] * 3, -0.5, -0.2), (0.0, [0.1] * 2, 0.2, 0.2), (1.0, [0.1], 1.1, 1.1), (-1.0, [0.1] * 30, -1.0, 2.0)])
def test_gra_35(outcome, steps, gra, dra):
    assert g_ra(outcome, steps, gate=0.0) == pytest.approx(gra, abs=1e-9)
    assert g_ra(outcome, steps, gate=None) == pytest.approx(dra, abs=1e-9)


def test_gate_uses_ge_and_multi_priority():
    assert g_ra(0.5, [0.1], gate=0.5) == pytest.approx(0.6)  # "meet" → ≥
    assert g_ra(0.4999, [0.1], gate=0.5) == pytest.approx(0.4999)
    # three channels: the 2nd is gated by the 1st, the 3rd by the 1st and 2nd
    assert gated_accumulation([1.0, 0.2, 0.05], [0.5, 0.1]) == pytest.approx(1.25)
    assert gated_accumulation([1.0, 0.05, 0.05], [0.5, 0.1]) == pytest.approx(1.05)
    assert gated_accumulation([0.0, 0.2, 0.05], [0.5, 0.1]) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="thresholds"):
        gated_accumulation([1.0, 0.2], [0.5, 0.1])


@pytest.mark.parametrize("length,expected", [
    (10000, 0.0), (16384, 0.0), (16385, -0.000244141), (18432, -0.5), (20480, -1.0), (20481, -1.0)])
def test_overlong_shaping_54(length, expected):
    assert overlong_penalty(length, 20480, 4096) == pytest.approx(expected, abs=1e-8)


def test_overlong_truncated_and_bad_input():
    assert overlong_penalty(100, 20480, 4096, truncated=True) == -1.0
    assert overlong_penalty(18432, 20480, 4096, penalty_factor=0.5) == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(10, 100, 200)


def test_dynamic_sampling_filter_54():
    groups = [[1, 1, 1, 1], [-1, -1, -1, -1], [1, -1, -1, 1]]
    assert filter_groups(groups, lambda g: g) == [[1, -1, -1, 1]]
    assert not has_reward_variance([]) and has_reward_variance([0.0, 0.5])


def test_dynamic_sampler_refill_and_error_54():
    batch = [[1, 1, 1, 1], [-1, -1, -1, -1], [1, -1, -1, 1]]  # one of three qualifies
    sampler = DynamicSampler(target=2, rewards_of=lambda g: g, max_num_gen_batches=10)
    assert not sampler.add(batch)
    assert sampler.add(batch)
    assert sampler.num_gen_batches == 2 and sampler.num_dropped == 4
    assert sampler.take() == [[1, -1, -1, 1], [1, -1, -1, 1]]
    with pytest.raises(RuntimeError, match="max_num_gen_batches=1"):
        DynamicSampler(target=2, rewards_of=lambda g: g, max_num_gen_batches=1).add(batch)
    unlimited = DynamicSampler(target=3, rewards_of=lambda g: g, max_num_gen_batches=0)
    for _ in range(2):
        unlimited.add(batch)
    assert not unlimited.ready
