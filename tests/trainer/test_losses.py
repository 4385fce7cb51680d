"""Losses, TRM and aggregation against algorithms.md §2.6, §5.4, §8.2–§8.4, plus gradient checks."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.losses import (
    aggregate_loss,
    behaviour_weights,
    decoupled_ppo_loss,
    denominators,
    exact_kl_from_logits,
    gspo_sequence_ratio,
    gspo_token_loss,
    k2,
    k3,
    k3_kl,
    ppo_clip_loss,
    reinforce_loss,
    trm_sequence_mask,
)

ATOL = 1e-5
LOG_RHO = torch.tensor([[0.01, -0.02, 0.05, 0.00], [0.00, 0.40, -0.01, 0.02]])
MASK = torch.ones(2, 4)


def close(x, expected, atol=ATOL):
    torch.testing.assert_close(x.float(), torch.as_tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


# -- §5.4 test 1: clip-higher ------------------------------------------------------------------

@pytest.mark.parametrize("adv,ratio,objective,clipped", [
    (1.0, 1.35, 1.28, True), (1.0, 1.25, 1.25, False), (-1.0, 0.7, -0.8, True), (-1.0, 1.5, -1.5, False)])
def test_clip_higher_54(adv, ratio, objective, clipped):
    r = torch.tensor(ratio, requires_grad=True)
    loss, is_clipped = ppo_clip_loss(r, torch.tensor(adv), 0.2, 0.28)
    close(-loss, objective)
    assert bool(is_clipped) == clipped
    (g,) = torch.autograd.grad(loss, r)
    assert (g.item() == 0.0) == clipped  # clipped side: exactly zero gradient


def test_symmetric_clip_would_clip_125():
    loss, clipped = ppo_clip_loss(torch.tensor(1.25), torch.tensor(1.0), 0.2, 0.2)
    close(-loss, 1.2)
    assert clipped


def test_ppo_leak_and_dual_clip_26d():
    # §2.6(d): ρ=900, A=−1, ε=0.2 → objective −900, gradient flows; dual clip c=3 caps it at −3.
    r = torch.tensor(900.0, requires_grad=True)
    loss, clipped = ppo_clip_loss(r, torch.tensor(-1.0), 0.2, 0.2)
    close(-loss, -900.0)
    assert not clipped and torch.autograd.grad(loss, r)[0].item() == 1.0
    loss, clipped = ppo_clip_loss(r, torch.tensor(-1.0), 0.2, 0.2, dual_clip=3.0)
    close(-loss, -3.0)
    assert clipped and torch.autograd.grad(loss, r)[0].item() == 0.0
    close(k2(torch.tensor(math.log(900))), 23.13, atol=1e-2)  # the doc rounds 23.1363 to 4 digits
    assert not trm_sequence_mask(torch.ones(1, 1), "max", 0.1, 0.002, log_ratio=torch.tensor([[math.log(900)]]))
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(r, torch.tensor(-1.0), dual_clip=1.0)


# -- §8.2 AReaL decoupled objective, §8.3 TIS --------------------------------------------------

@pytest.mark.parametrize("adv,objective,grad_zero", [(1.0, 1.44, True), (-1.0, -1.8, False)])
def test_areal_decoupled_82(adv, objective, grad_zero):
    logp = torch.tensor(math.log(0.9), requires_grad=True)
    prox, behav = torch.tensor(math.log(0.6)), torch.tensor(math.log(0.5))
    loss, _ = decoupled_ppo_loss(logp, prox, behav, torch.tensor(adv), 0.2, 0.2, tis_cap=None)
    close(-loss, objective)
    (g,) = torch.autograd.grad(loss, logp)
    assert (g.item() == 0.0) == grad_zero


def test_tis_weight_truncated_and_detached_83():
    prox = torch.tensor(math.log(0.3))
    behav = torch.tensor(math.log(0.1), requires_grad=True)
    w = behaviour_weights(prox, behav, cap=2.0)
    close(w, 2.0)
    assert not w.requires_grad
    close(behaviour_weights(prox, behav, cap=None), 3.0)
    # the clipped per-token objective times 2.0, gradient only through π_θ
    logp = torch.tensor(math.log(0.3), requires_grad=True)
    loss, _ = decoupled_ppo_loss(logp, prox, behav, torch.tensor(1.0), tis_cap=2.0)
    close(loss, -2.0)
    loss.backward()
    assert behav.grad is None and logp.grad.item() == pytest.approx(-2.0)


def test_reinforce_weight_detached():
    logp = torch.tensor([math.log(0.3)], requires_grad=True)
    loss = reinforce_loss(logp, torch.tensor([math.log(0.1)]), torch.tensor([1.0]), tis_cap=2.0)
    loss.sum().backward()
    close(logp.grad, [-2.0])  # −sg[min(3, 2)]·Â


# -- §8.4 GSPO ---------------------------------------------------------------------------------

def test_gspo_sequence_ratio_and_clip_84():
    lr = torch.tensor([[0.01, -0.01, 0.3]])
    close(gspo_sequence_ratio(lr, torch.ones(1, 3)), [1.105171])
    logp = torch.tensor([[0.01, -0.01, 0.3]], requires_grad=True)
    loss, clipped = gspo_token_loss(logp, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3))
    close(-loss, [[1.0004] * 3])
    assert clipped.all()
    loss.sum().backward()
    assert logp.grad.abs().max() == 0


def test_gspo_token_gradient_equals_sequence_gspo():
    torch.manual_seed(0)
    old = torch.randn(2, 5) * 0.01
    cur = (old + torch.randn(2, 5) * 1e-4).requires_grad_()
    adv = torch.tensor([[0.5] * 5, [-1.0] * 5])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float)
    loss, _ = gspo_token_loss(cur, old, adv, mask, 0.2, 0.2)
    aggregate_loss(loss, mask, "seq-mean-token-mean").backward()
    g_tok = cur.grad.clone()
    cur.grad = None
    s = gspo_sequence_ratio(cur - old, mask)
    a = adv[:, 0]
    seq_loss = torch.maximum(-a * s, -a * s.clamp(0.8, 1.2)).mean()
    seq_loss.backward()
    torch.testing.assert_close(g_tok, cur.grad, atol=1e-6, rtol=1e-5)


# -- §2.6 TRM ----------------------------------------------------------------------------------

def test_k2_k3_values_26a():
    close(k2(LOG_RHO).amax(-1), [0.00125, 0.08])
    close(k3(LOG_RHO)[0], [5.01671e-5, 1.98673e-4, 1.27110e-3, 0])
    close(k3(LOG_RHO)[1], [0, 0.0918247, 4.98337e-5, 2.01340e-4])
    close(k3(LOG_RHO).mean(-1), [3.79984e-4, 0.0230190])
    close(k2(torch.tensor(0.3)), k2(torch.tensor(-0.3)))  # symmetric in ρ ↔ 1/ρ


@pytest.mark.parametrize("mode,delta,delta_avg,expected", [
    ("max", 0.05, 1.0, [True, False]), ("avg", 1.0, 0.001, [True, False]),
    ("both", 0.1, 0.002, [True, False]), ("max", 0.1, 1.0, [True, True]), ("off", 0.0, 0.0, [True, True])])
def test_trm_masks_26a(mode, delta, delta_avg, expected):
    assert trm_sequence_mask(MASK, mode, delta, delta_avg, log_ratio=LOG_RHO).tolist() == expected


def test_trm_policy_tokens_only_zero_token_accept_nan_reject():
    lr = torch.tensor([[5.0, 0.0], [0.0, 0.0], [float("nan"), 0.0], [0.0, float("inf")]])
    mask = torch.tensor([[0, 1], [0, 0], [1, 1], [1, 1]])
    assert trm_sequence_mask(mask, "both", 0.1, 0.002, log_ratio=lr).tolist() == [True, True, False, False]
    with pytest.raises(ValueError, match="unknown TRM mode"):
        trm_sequence_mask(mask, "median", 0.1, 0.1, log_ratio=lr)


def test_trm_exact_kl_26b():
    roll = torch.tensor([0.7, 0.2, 0.1]).log()
    near, far = torch.tensor([0.6, 0.3, 0.1]).log(), torch.tensor([0.7, 0.29, 0.01]).log()
    close(exact_kl_from_logits(roll, near), 0.0268125)
    close(exact_kl_from_logits(roll, far), 0.155946)
    kl = torch.stack([exact_kl_from_logits(roll, near), exact_kl_from_logits(roll, far)]).unsqueeze(-1)
    assert trm_sequence_mask(torch.ones(2, 1), "max", 0.05, 1.0, token_kl=kl).tolist() == [True, False]
    nan_kl = torch.tensor([[float("nan")]])
    assert trm_sequence_mask(torch.ones(1, 1), "max", 0.05, 1.0, token_kl=nan_kl).tolist() == [False]


def test_trm_divisor_rule_26a():
    """Only A contributes; the sum is divided by 2 sequences / 8 tokens ("total") or 1 / 4 ("accepted")."""
    per_token = torch.ones(2, 4)
    accept = trm_sequence_mask(MASK, "max", 0.05, 0.0, log_ratio=LOG_RHO)
    trm_mask = MASK * accept.unsqueeze(-1)
    assert denominators(MASK, "token-mean").tokens == 8 and denominators(trm_mask, "token-mean").tokens == 4
    close(aggregate_loss(per_token, trm_mask, "token-mean", norm_mask=MASK), 4 / 8)
    close(aggregate_loss(per_token, trm_mask, "token-mean"), 4 / 4)
    close(aggregate_loss(per_token, trm_mask, "seq-mean-token-sum", norm_mask=MASK), 4 / 2)
    close(aggregate_loss(per_token, trm_mask, "seq-mean-token-sum"), 4 / 1)


def test_trm_masked_sequence_has_exactly_zero_gradient():
    torch.manual_seed(0)
    logp = (torch.randn(2, 4) * 0.1).requires_grad_()
    adv = torch.tensor([[1.0] * 4, [-2.0] * 4])
    accept = trm_sequence_mask(MASK, "max", 0.05, 0.0, log_ratio=LOG_RHO)
    loss, _ = decoupled_ppo_loss(logp, logp.detach(), logp.detach() - LOG_RHO, adv, tis_cap=2.0)
    aggregate_loss(loss, MASK * accept.unsqueeze(-1), "token-mean", norm_mask=MASK).backward()
    assert torch.all(logp.grad[1] == 0) and torch.all(logp.grad[0] != 0)


# -- §5.4 test 3: aggregation ------------------------------------------------------------------

def test_aggregation_modes_54():
    per_token = torch.tensor([[2.0, 2, 0, 0, 0, 0], [1.0, 1, 1, 1, 1, 1]])
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    close(aggregate_loss(per_token, mask, "token-mean"), 1.25)
    close(aggregate_loss(per_token, mask, "seq-mean-token-mean"), 1.5)
    close(aggregate_loss(per_token, mask, "seq-mean-token-sum"), 5.0)
    close(aggregate_loss(per_token, mask, "seq-mean-token-sum-norm"), 10 / 6)
    close(aggregate_loss(per_token, mask, "seq-mean-token-sum-norm",
                         denom=denominators(mask, "seq-mean-token-sum-norm", loss_scale_factor=4.0)), 2.5)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate_loss(per_token, mask, "sum")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_micro_batches_with_global_denominators_equal_full_batch(mode):
    torch.manual_seed(0)
    per_token = torch.randn(4, 6)
    mask = (torch.rand(4, 6) > 0.3).float()
    mask[3] = 0  # a padding row
    full = aggregate_loss(per_token, mask, mode)
    d = denominators(mask, mode)
    parts = sum(aggregate_loss(per_token[i:i + 2], mask[i:i + 2], mode, denom=d) for i in (0, 2))
    close(parts, full.item())


def test_k3_kl_reference():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    close(k3_kl(logp, ref), [0.5 - math.log(0.5) - 1])
    close(k3_kl(ref, ref), [0.0])
