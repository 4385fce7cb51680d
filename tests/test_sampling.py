"""The hf engine's token draw (`inference/sampling.py`): Gumbel-max by default (an inverse CDF and
`torch.multinomial` on request), each drawn from the processed distribution exactly."""

from __future__ import annotations

import pytest
import torch

from agentrl.inference.sampling import SAMPLERS, gumbel_max, inverse_cdf, processed_logprobs, sample_tokens


def test_inverse_cdf_resolves_a_tail_of_tiny_probabilities_behind_a_likely_token():
    """20 000 tokens of probability 5e-8 behind one of ~0.999: each has its own interval (a float32
    CDF near 1 has steps of 6e-8 and would merge them), and a u in token k's interval gives k."""
    tail, p_tail = 20_000, 5e-8
    probs = torch.full((tail + 1,), p_tail, dtype=torch.float64)
    probs[0] = 1 - tail * p_tail
    logp = probs.log().float()[None].expand(5, -1)
    ks = torch.tensor([0, 1, 777, 12_345, tail - 1])
    head = float(logp[0, 0].double().exp())
    u = (head + (ks.double() + 0.5) * p_tail) / float(logp[0].double().exp().sum())
    assert inverse_cdf(logp, u).tolist() == (ks + 1).tolist()
    assert inverse_cdf(logp[:1], torch.tensor([0.0], dtype=torch.float64)).tolist() == [0]


def test_a_removed_token_is_never_drawn_even_at_the_ends_of_the_unit_interval():
    logits = torch.tensor([[-1.0, 3.0, 2.0, 1.0, 0.5, 2.5, -2.0]])  # removed tokens at both ends
    logp = processed_logprobs(logits, torch.tensor([1.0]), torch.tensor([0.6]))  # top-p removes some
    kept = logp[0].isfinite()
    assert not kept[0] and not kept[-1] and bool(kept.any())
    for u in (0.0, 0.3, 0.999999, 1 - 2 ** -53):
        assert bool(kept[inverse_cdf(logp, torch.tensor([u], dtype=torch.float64))[0]])


@pytest.mark.parametrize("method", SAMPLERS)
def test_seeded_draws_follow_the_distribution_and_ignore_the_batch(method):
    probs = torch.tensor([0.05, 0.4, 0.0, 0.25, 0.3])
    rows = 20_000
    logp = probs.log()[None].expand(rows, -1)
    tokens, lps = sample_tokens(logp, [False] * rows, [torch.Generator().manual_seed(i) for i in range(rows)], method)
    freq = torch.bincount(torch.tensor(tokens), minlength=5).double() / rows
    assert freq[2] == 0
    assert float((freq - probs.double()).abs().max()) < 5 * (0.25 / rows) ** 0.5  # 5 sigma
    assert torch.allclose(torch.tensor(lps), probs.log()[torch.tensor(tokens)])
    # a seeded row draws the same token alone and beside others (greedy ones too)
    alone = sample_tokens(logp[:1], [False], [torch.Generator().manual_seed(7)], method)[0]
    mixed = sample_tokens(logp[:3], [True, False, False],
                          [torch.Generator().manual_seed(1), torch.Generator().manual_seed(7),
                           torch.Generator().manual_seed(8)], method)[0]
    assert mixed[0] == 1 and mixed[1] == alone[0]


def test_gumbel_max_picks_blocks_then_tokens_with_the_distributions_mass():
    """Three blocks of 4 over a vocabulary of 10 (the last one padded), with likely tokens in each
    and a removed one; then 4096 tokens of 5e-8 (16 blocks) behind a block of likely ones, which
    100 000 draws reach as often as their mass (2e-4) says."""
    probs = torch.tensor([0.1, 0.0, 0.05, 0.15, 0.3, 0.02, 0.03, 0.05, 0.2, 0.1])
    rows = 20_000
    gens = [torch.Generator().manual_seed(i) for i in range(rows)]
    tokens = gumbel_max(probs.log()[None].expand(rows, -1), gens, block=4)
    freq = torch.bincount(tokens, minlength=10).double() / rows
    assert freq[1] == 0
    assert float((freq - probs.double()).abs().max()) < 5 * (0.25 / rows) ** 0.5  # 5 sigma
    tail, p_tail = 4096, 5e-8  # 16 blocks of 256, mass 2e-4
    tail_probs = torch.full((256 + tail,), p_tail, dtype=torch.float64)
    tail_probs[:256] = (1 - tail * p_tail) / 256
    logp = tail_probs.log().float()
    draws = torch.cat([gumbel_max(logp[None].expand(5000, -1), [torch.Generator().manual_seed(s * 5000 + i)
                                                                 for i in range(5000)]) for s in range(20)])
    assert 4 <= int((draws >= 256).sum()) <= 40  # Poisson(20): P(outside) < 1e-3


def test_a_seeded_gumbel_max_draw_survives_log_prob_noise_that_moves_an_inverse_cdf():
    """Log-probs of one vocabulary (SmolLM2's 49152) from two kernel shapes differ by fp32 noise:
    noise of 1e-5 on the logits leaves all 400 seeded Gumbel-max draws as they were, while an
    inverse CDF (whose boundaries sum every earlier entry's noise) moves some of the same seeds."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(49152, generator=gen) * 2.5
    clean = torch.log_softmax(logits, -1)
    noisy = torch.log_softmax(logits + 1e-5 * torch.randn(49152, generator=gen), -1)
    n = 400

    def draws(logp: torch.Tensor, method: str) -> list[int]:
        return sample_tokens(logp[None].expand(n, -1), [False] * n,
                             [torch.Generator().manual_seed(s) for s in range(n)], method)[0]

    assert draws(clean, "gumbel_max") == draws(noisy, "gumbel_max")
    assert draws(clean, "inverse_cdf") != draws(noisy, "inverse_cdf")


def test_the_engine_names_an_unknown_sampler_before_loading_anything():
    from agentrl.inference.hf import HFEngine

    with pytest.raises(ValueError, match="sampler must be one of gumbel_max, inverse_cdf, multinomial"):
        HFEngine("/nonexistent/model", sampler="gumbel")


def test_processed_logprobs_scale_each_row_by_its_temperature_and_greedy_rows_by_one() -> None:
    logits = torch.tensor([[2.0, 1.0, -1.0], [0.5, 0.0, 3.0], [1.0, 2.0, 3.0]])
    logp = processed_logprobs(logits, torch.tensor([1.0, 0.5, 0.0]), torch.ones(3))
    expected = torch.log_softmax(logits / torch.tensor([[1.0], [0.5], [1.0]]), dim=-1)
    assert torch.allclose(logp, expected)
    assert torch.equal(processed_logprobs(logits, torch.ones(3), torch.ones(3)), torch.log_softmax(logits, dim=-1))
