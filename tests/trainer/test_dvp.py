"""Dynamic Vocabulary Pruning against algorithms.md §7.3, the §7.1 mismatch bound, and the real
min-p / top-p samplers of transformers on a real (tiny) Llama."""

from __future__ import annotations

import pytest
import torch
from transformers import MinPLogitsWarper, TopPLogitsWarper

from agentrl.trainer.dvp import (
    exact_mismatch_bound,
    min_p_safe_set,
    mismatch_bound,
    out_of_support,
    pruned_logprobs,
    pruned_mass,
    pruned_token_logprobs,
    top_p_safe_set,
)

ATOL = 1e-5
Z = torch.tensor([3.0, 2.0, 0.0, -3.0])  # §7.3


def close(x, expected, atol=ATOL):
    torch.testing.assert_close(x.double(), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def test_safe_set_mass_and_logprobs_73():
    close(torch.softmax(Z, -1), [0.704153, 0.259044, 0.035058, 0.001745])
    close(0.1 * torch.softmax(Z, -1).max(), 0.0704153)  # the min-p threshold at α=0.1
    safe = min_p_safe_set(Z, 0.1)
    assert safe.tolist() == [True, True, False, False]
    close(pruned_mass(Z, safe), 0.0368032)
    close(torch.log_softmax(Z, -1)[:2], [-0.350759, -1.350759])
    logp = pruned_logprobs(Z, safe)
    close(logp[:2], [-0.313262, -1.313262])
    assert torch.isneginf(logp[2:]).all()
    assert out_of_support(safe, torch.tensor(2)) and out_of_support(safe, torch.tensor(3))
    assert not out_of_support(safe, torch.tensor(0))


def test_pruned_mass_is_the_tv_to_the_full_policy():
    torch.manual_seed(0)
    z = torch.randn(5, 50) * 3
    safe = min_p_safe_set(z, 0.05)
    tv = 0.5 * (pruned_logprobs(z, safe).exp() - torch.softmax(z, -1)).abs().sum(-1)
    close(pruned_mass(z, safe), tv.double(), atol=1e-6)
    close(pruned_logprobs(z, safe).exp().sum(-1), torch.ones(5), atol=1e-6)


def test_mismatch_bound_73():
    p = torch.softmax(Z.double(), -1)
    close(mismatch_bound(p, 0.01), [0.005917, 0.014819, 0.019299, 0.019965])


def _mismatch(z: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """max over draws of |log π'(v) − log π(v)| per token v, π' = softmax(z + δ)."""
    z = z.double()
    return (torch.log_softmax(z + deltas, -1) - torch.log_softmax(z, -1)).abs().amax(0)


def test_uniform_perturbations_stay_under_the_first_order_bound_73():
    # §7.3: 20k draws of δ ~ U[−0.01, 0.01]^V; the doc's maxima were [0.005698, 0.014569, 0.018786, 0.019297]
    g = torch.Generator().manual_seed(0)
    deltas = (torch.rand(20_000, 4, generator=g, dtype=torch.float64) * 2 - 1) * 0.01
    worst = _mismatch(Z, deltas)
    bound = mismatch_bound(torch.softmax(Z.double(), -1), 0.01)
    assert (worst <= bound).all()
    assert (worst >= 0.9 * bound).all()  # the draws come close: the (1−p) scaling is tight


def test_first_order_bound_is_exceeded_at_second_order_but_the_exact_bound_holds():
    # Corner δ_y = −ε, δ_{v≠y} = +ε attains the exact worst case, which is 2ε²p(1−p) above 2ε(1−p)
    p = torch.softmax(Z.double(), -1)
    for y in range(4):
        corner = torch.full((1, 4), 0.01, dtype=torch.float64)
        corner[0, y] = -0.01
        err = _mismatch(Z, corner)[y]
        close(err, exact_mismatch_bound(p[y], 0.01), atol=1e-12)
        assert err > mismatch_bound(p[y], 0.01)
        excess = err - mismatch_bound(p[y], 0.01)  # = 2ε²p(1−p) + O(ε³)
        assert excess == pytest.approx(float(2 * 0.01 ** 2 * p[y] * (1 - p[y])), rel=0.01)
    g = torch.Generator().manual_seed(1)
    signs = torch.where(torch.rand(5000, 4, generator=g) < 0.5, -0.01, 0.01).double()
    assert (_mismatch(Z, signs) <= exact_mismatch_bound(p, 0.01) + 1e-15).all()


def test_pruned_token_logprobs_batched_with_out_of_support_placeholder():
    z = torch.stack([Z, Z.flip(-1)])  # second row [−3, 0, 2, 3]: V_safe = {2, 3}
    tokens = torch.tensor([1, 2])
    logp, oos = pruned_token_logprobs(z, tokens, alpha=0.1)
    assert oos.tolist() == [False, False]
    close(logp, [-1.313262, -1.313262])
    logp, oos = pruned_token_logprobs(z, torch.tensor([3, 0]), alpha=0.1)
    assert oos.tolist() == [True, True] and logp.tolist() == [0.0, 0.0]


def test_alpha_extremes_and_top_p():
    assert min_p_safe_set(Z, 1.0).tolist() == [True, False, False, False]
    close(pruned_logprobs(Z, min_p_safe_set(Z, 1e-9)), torch.log_softmax(Z.double(), -1))
    assert top_p_safe_set(Z, 0.70).tolist() == [True, False, False, False]
    assert top_p_safe_set(Z, 0.96).tolist() == [True, True, False, False]  # 0.963197 ≥ 0.96
    assert top_p_safe_set(Z, 0.999).tolist() == [True, True, True, True]


@pytest.mark.parametrize("call,match", [
    (lambda: min_p_safe_set(Z, 0.0), "alpha"),
    (lambda: min_p_safe_set(Z, 1.5), "alpha"),
    (lambda: min_p_safe_set(torch.zeros(3, 0), 0.1), "V >= 1"),
    (lambda: top_p_safe_set(Z, 0.0), "top_p"),
    (lambda: pruned_logprobs(Z, torch.ones(3, dtype=torch.bool)), "safe mask shape"),
    (lambda: out_of_support(torch.ones(2, 4, dtype=torch.bool), torch.tensor([0])), "tokens shape"),
    (lambda: out_of_support(torch.ones(4, dtype=torch.bool), torch.tensor(4)), "token ids"),
    (lambda: mismatch_bound(0.5, -0.1), "eps"),
    (lambda: exact_mismatch_bound(0.5, -0.1), "eps"),
])
def test_bad_input_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- real samplers: transformers' min-p / top-p warpers and generate() on a real model ---------

@pytest.mark.parametrize("alpha", [0.02, 0.1, 0.5])
def test_min_p_safe_set_matches_transformers_warper(tiny_model, alpha):
    ids = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = tiny_model(input_ids=ids).logits[:, -1].float() * 20  # sharpen: a real tail
    warped = MinPLogitsWarper(min_p=alpha)(ids, logits.clone())
    assert torch.equal(min_p_safe_set(logits, alpha), torch.isfinite(warped))
    safe = min_p_safe_set(logits, alpha)
    assert 0 < safe.sum() < safe.numel()  # something was pruned, something kept
    torch.testing.assert_close(pruned_logprobs(logits, safe).masked_fill(~safe, 0),
                               torch.log_softmax(warped, -1).masked_fill(~safe, 0), atol=1e-6, rtol=0)


def test_top_p_safe_set_matches_transformers_warper(tiny_model):
    ids = torch.randint(0, 64, (4, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = tiny_model(input_ids=ids).logits[:, -1].float() * 20
    for p in (0.5, 0.9, 0.99):
        warped = TopPLogitsWarper(top_p=p)(ids, logits.clone())
        assert torch.equal(top_p_safe_set(logits, p), torch.isfinite(warped)), p


def test_tokens_sampled_with_min_p_are_in_the_training_safe_set(tiny_model):
    """Rollout samples from π̃ (min_p=α) and the trainer rebuilds V_safe from its own logits
    (§7.2): with identical numerics no sampled token is out of support, and the processed
    log-probs the sampler used equal log π̃_θ of the sampled tokens."""
    alpha = 0.1
    prompt = torch.randint(0, 64, (4, 5), generator=torch.Generator().manual_seed(2))
    tiny_model.generation_config.pad_token_id = 0
    torch.manual_seed(0)
    with torch.no_grad():
        tiny_model.lm_head.weight.mul_(20)  # a peaked model, so min-p prunes
        out = tiny_model.generate(prompt, do_sample=True, min_p=alpha, top_k=0, top_p=1.0, temperature=1.0,
                                  max_new_tokens=12, output_scores=True, output_logits=True,
                                  return_dict_in_generate=True)
    new = out.sequences[:, prompt.shape[1]:]
    raw, processed = torch.stack(out.logits, 1).float(), torch.stack(out.scores, 1).float()
    logp, oos = pruned_token_logprobs(raw, new, alpha)
    assert not oos.any()
    sampler_logp = torch.log_softmax(processed, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp, sampler_logp, atol=1e-5, rtol=0)
    assert (pruned_mass(raw, min_p_safe_set(raw, alpha)) > 0).any()
