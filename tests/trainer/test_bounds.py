"""TRM bound calculators against algorithms.md §2.6(c) and §2.7, plus an exact small-MDP check
that each bound really bounds the surrogate error (§2.1)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from agentrl.trainer.bounds import (
    adaptive,
    bound_table,
    classical_bound_kl,
    classical_bound_tv,
    coupling,
    mixed_kl,
    mixed_tv,
    pinsker_marginal_kl,
    pinsker_marginal_tv,
    unified_bound,
)

ATOL = 1e-5
# §2.6(c): T=4096, δ=1e-4, ε=5e-3, D_KL^seq=0.01, D_TV^seq=0.05
T, DELTA, EPS, SEQ_KL, SEQ_TV = 4096, 1e-4, 5e-3, 0.01, 0.05


@pytest.mark.parametrize("name,value", [
    ("classical_kl", 1677.312), ("classical_tv", 838.656), ("pinsker_marginal_kl", 34.9461),
    ("pinsker_marginal_tv", 24.7106), ("mixed_kl", 8.192), ("mixed_tv", 4.096), ("coupling", 79.91)])
def test_bound_table_26c(name, value):
    # the doc prints 6 significant digits, so PM values are checked to the printed precision
    atol = 5e-5 if name.startswith("pinsker") else ATOL
    assert bound_table(T, DELTA, EPS, SEQ_KL, SEQ_TV)[name] == pytest.approx(value, abs=atol)


def test_coupling_with_eps_from_pinsker_26c():
    # "113.838 if ε = √(δ/2)": the TV maximum implied by δ through Pinsker
    assert coupling(T, math.sqrt(DELTA / 2)) == pytest.approx(113.838, abs=5e-4)


def test_unified_headline_27():
    b = unified_bound(T, DELTA, EPS, SEQ_KL, SEQ_TV)
    assert b == pytest.approx(4.096, abs=ATOL) and b <= 4.1
    assert classical_bound_kl(T, DELTA) / b == pytest.approx(409.5, abs=1e-3)  # "409× tighter"


def test_uncapped_forms_match_when_caps_are_inactive():
    # §2.2 uncapped asymptotics: (4/3)T^{3/2}δ, (8/3)T^{3/2}ε√(δ/2), 2T√(δ D_KL^seq)
    assert pinsker_marginal_kl(T, DELTA) == pytest.approx(4 / 3 * T ** 1.5 * DELTA, rel=1e-3)
    assert pinsker_marginal_tv(T, EPS, DELTA) == pytest.approx(8 / 3 * T ** 1.5 * EPS * math.sqrt(DELTA / 2), rel=1e-3)
    assert mixed_kl(T, DELTA, SEQ_KL) == pytest.approx(2 * T * math.sqrt(DELTA * SEQ_KL), rel=1e-12)


def test_scaling_in_T():
    # classical O(T²), Pinsker-Marginal O(T^{3/2}), Mixed O(T), capped Coupling O(T)
    ratio = {name: bound_table(2 * T, DELTA, EPS, SEQ_KL, SEQ_TV)[name] / v
             for name, v in bound_table(T, DELTA, EPS, SEQ_KL, SEQ_TV).items()}
    assert ratio["classical_kl"] == pytest.approx(4, rel=1e-3)
    assert ratio["pinsker_marginal_kl"] == pytest.approx(2 ** 1.5, rel=1e-2)
    assert ratio["mixed_kl"] == pytest.approx(2) and ratio["mixed_tv"] == pytest.approx(2)
    assert ratio["coupling"] == pytest.approx(2, rel=3e-2)


def test_caps_bind_for_large_divergences():
    # every min(1, ·) saturated: B_PM^KL = 4·Σ_t min(1, ·), B_Mix^KL = 4T, B_Coup = 4(T−1)
    assert pinsker_marginal_kl(3, 8.0) == pytest.approx(4 * (0 + 1 + 1))
    assert mixed_kl(10, 8.0, 8.0) == pytest.approx(40)
    assert mixed_tv(10, 1.0, 1.0) == pytest.approx(40)
    assert coupling(10, 1.0) == pytest.approx(4 * 9)
    assert classical_bound_tv(2, 0.5) == pytest.approx(1.0)


def test_adaptive_is_data_dependent():
    # D̄_t = ε everywhere reproduces a Pinsker-Marginal-sized bound; D̄_t = 0 gives 0
    assert adaptive([EPS] * T, EPS, DELTA) == pytest.approx(24.7106, abs=1e-3)
    assert adaptive([0.0] * T, EPS, DELTA) == 0.0
    # the last token has T−t = 0 steps left to compound, so it costs nothing
    assert adaptive([0.0, 0.0, 0.3], 0.1, 0.02) == 0.0
    assert adaptive([0.3, 0.0, 0.0], 0.1, 0.02) == pytest.approx(4 * 0.3 * min(1, 0.2, math.sqrt(0.02)))
    tab = bound_table(T, DELTA, EPS, SEQ_KL, SEQ_TV, mean_tv=[1e-6] * T)
    assert unified_bound(T, DELTA, EPS, SEQ_KL, SEQ_TV, mean_tv=[1e-6] * T) == tab["adaptive"] < 4.096


@pytest.mark.parametrize("call,match", [
    (lambda: classical_bound_kl(0, 0.1), "horizon T"),
    (lambda: classical_bound_kl(4.0, 0.1), "horizon T"),
    (lambda: pinsker_marginal_kl(4, -1e-3), "delta"),
    (lambda: mixed_kl(4, 0.1, float("nan")), "seq_kl"),
    (lambda: mixed_tv(4, 0.1, 1.5), "seq_tv"),
    (lambda: coupling(4, -0.1), "eps"),
    (lambda: adaptive([], 0.1, 0.1), "horizon T"),
    (lambda: adaptive([0.1, 2.0], 0.1, 0.1), r"mean_tv\[t\]"),
    (lambda: bound_table(4, 0.1, 0.1, 0.1, 0.1, mean_tv=[0.1]), "one D̄_t per position"),
])
def test_bad_input_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- the bounds bound the real error of an exactly enumerated autoregressive policy pair --------

def _exact_error_and_divergences(V: int, horizon: int, sigma: float, seed: int):
    """Enumerate every sequence of a V-token, `horizon`-step autoregressive model with a distinct
    random next-token distribution per prefix; π_θ perturbs π_roll's logits by N(0, σ²).
    Returns Error = J(π_θ) − J(π_roll) − L(π_θ) with the exact surrogate
    L = Σ_t E_{c_t∼d_t^roll} Σ_y π_θ(y|c_t) A_roll(c_t, y) (§2.1, equal to E_roll[(R − J_roll)Σ_t ρ_t]),
    and (δ, ε, D_KL^seq, D_TV^seq, D̄_t) computed exactly."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [c for n in range(horizon) for c in itertools.product(range(V), repeat=n)]
    roll = {c: torch.softmax(1.5 * torch.randn(V, generator=g, dtype=torch.float64), -1) for c in prefixes}
    theta = {c: torch.softmax(roll[c].log() + sigma * torch.randn(V, generator=g, dtype=torch.float64), -1)
             for c in prefixes}
    seqs = list(itertools.product(range(V), repeat=horizon))
    reward = {y: float(torch.rand((), generator=g, dtype=torch.float64)) for y in seqs}

    def prob(pol, y):
        return math.prod(float(pol[y[:t]][y[t]]) for t in range(len(y)))

    q = dict(reward)  # Q_roll of every prefix: E_roll[R | prefix], from the leaves up
    for n in range(horizon - 1, -1, -1):
        for c in itertools.product(range(V), repeat=n):
            q[c] = sum(float(roll[c][v]) * q[(*c, v)] for v in range(V))
    surrogate = sum(prob(roll, c) * sum(float(theta[c][v]) * (q[(*c, v)] - q[c]) for v in range(V))
                    for c in prefixes)
    j_theta = sum(prob(theta, y) * reward[y] for y in seqs)
    error = j_theta - q[()] - surrogate
    tv = {c: 0.5 * float((theta[c] - roll[c]).abs().sum()) for c in prefixes}
    kl = {c: float((roll[c] * (roll[c].log() - theta[c].log())).sum()) for c in prefixes}
    seq_kl = sum(prob(roll, c) * kl[c] for c in prefixes)
    seq_tv = 0.5 * sum(abs(prob(theta, y) - prob(roll, y)) for y in seqs)
    mean_tv = [sum(prob(roll, c) * tv[c] for c in itertools.product(range(V), repeat=n)) for n in range(horizon)]
    return error, max(kl.values()), max(tv.values()), seq_kl, seq_tv, mean_tv


@pytest.mark.parametrize("sigma,seed", [(0.1, 0), (1.0, 1), (3.0, 2)])
def test_every_bound_bounds_the_exact_error(sigma, seed):
    error, delta, eps, seq_kl, seq_tv, mean_tv = _exact_error_and_divergences(3, 4, sigma, seed)
    assert abs(error) > 1e-6  # a real, non-trivial surrogate error
    for name, bound in bound_table(4, delta, eps, seq_kl, seq_tv, mean_tv).items():
        assert abs(error) <= bound, (name, error, bound)
