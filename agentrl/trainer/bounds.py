"""Trust Region Masking error bounds (arXiv 2512.23075, algorithms.md §2.2) as pure functions.

Each bound caps |Error(π_θ)| = |J(π_θ) − J(π_roll) − L(π_θ)| for a horizon of T policy tokens,
given the token maxima δ = D_KL^{tok,max} (forward KL, π_roll first) and ε = D_TV^{tok,max} and,
for the Mixed bounds, the sequence divergences D_KL^seq and D_TV^seq (§2.1). They are calculators
for choosing the TRM threshold and for reporting; training itself uses the masks in `losses.py`.
Every bound is in reward units (R ∈ [0, 1]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _check_horizon(T: int) -> None:
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"horizon T must be an int >= 1, got {T!r}")


def _check_kl(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite KL >= 0, got {value!r}")


def _check_tv(name: str, value: float) -> None:
    if not (math.isfinite(value) and 0 <= value <= 1):
        raise ValueError(f"{name} must be a total variation in [0, 1], got {value!r}")


def _pinsker_marginal_sum(T: int, delta: float) -> float:
    """Σ_{t=1}^T min(1, √((t−1)δ/2)): Pinsker on the marginal drift after t−1 tokens (§2.2)."""
    return math.fsum(min(1.0, math.sqrt((t - 1) * delta / 2)) for t in range(1, T + 1))


def classical_bound_kl(T: int, delta: float) -> float:
    """Classical TRPO-style bound in KL form, algorithms.md §2.2 row 1: T(T−1)δ, O(T²)."""
    _check_horizon(T)
    _check_kl("delta", delta)
    return T * (T - 1) * delta


def classical_bound_tv(T: int, eps: float) -> float:
    """Classical bound in TV form, algorithms.md §2.2 row 1: 2T(T−1)ε² (≤ T(T−1)δ by Pinsker)."""
    _check_horizon(T)
    _check_tv("eps", eps)
    return 2 * T * (T - 1) * eps ** 2


def pinsker_marginal_kl(T: int, delta: float) -> float:
    """Pinsker-Marginal bound, KL form (TRM, algorithms.md §2.2):
    B_PM^KL = 4 min(1, √(δ/2)) Σ_{t=1}^T min(1, √((t−1)δ/2)); uncapped ≈ (4/3) T^{3/2} δ."""
    _check_horizon(T)
    _check_kl("delta", delta)
    return 4 * min(1.0, math.sqrt(delta / 2)) * _pinsker_marginal_sum(T, delta)


def pinsker_marginal_tv(T: int, eps: float, delta: float) -> float:
    """Pinsker-Marginal bound, TV form (TRM, algorithms.md §2.2):
    B_PM^TV = 4 min(1, ε) Σ_{t=1}^T min(1, √((t−1)δ/2)); uncapped ≈ (8/3) T^{3/2} ε √(δ/2)."""
    _check_horizon(T)
    _check_tv("eps", eps)
    _check_kl("delta", delta)
    return 4 * min(1.0, eps) * _pinsker_marginal_sum(T, delta)


def mixed_kl(T: int, delta: float, seq_kl: float) -> float:
    """Mixed bound, KL form (TRM, algorithms.md §2.2):
    B_Mix^KL = 4T min(1, √(δ/2)) min(1, √(D_KL^seq/2)); uncapped 2T √(δ D_KL^seq), O(T)."""
    _check_horizon(T)
    _check_kl("delta", delta)
    _check_kl("seq_kl", seq_kl)
    return 4 * T * min(1.0, math.sqrt(delta / 2)) * min(1.0, math.sqrt(seq_kl / 2))


def mixed_tv(T: int, eps: float, seq_tv: float) -> float:
    """Mixed bound, TV form (TRM, algorithms.md §2.2): B_Mix^TV = 4T min(1, ε) min(1, D_TV^seq)."""
    _check_horizon(T)
    _check_tv("eps", eps)
    _check_tv("seq_tv", seq_tv)
    return 4 * T * min(1.0, eps) * min(1.0, seq_tv)


def coupling(T: int, eps: float) -> float:
    """Coupling bound (TRM, algorithms.md §2.2): B_Coup = 4 min(1, ε) Σ_{t=1}^T min(1, (t−1)ε).
    O(T²) while (T−1)ε < 1, O(T) once the per-step coupling failure is capped at 1."""
    _check_horizon(T)
    _check_tv("eps", eps)
    return 4 * min(1.0, eps) * math.fsum(min(1.0, (t - 1) * eps) for t in range(1, T + 1))


def adaptive(mean_tv: Sequence[float], eps: float, delta: float) -> float:
    """Adaptive (hybrid) bound (TRM, algorithms.md §2.2):
    B_Adap^* = 4 Σ_{t=1}^T D̄_t min(1, (T−t)ε, √((T−t)δ/2)), with D̄_t = E_{c_t∼d_t^roll}[D_TV^tok(c_t)]
    measured per position (T = len(mean_tv)). Data-dependent: D̄_t ≤ ε recovers a PM-like bound."""
    T = len(mean_tv)
    _check_horizon(T)
    _check_tv("eps", eps)
    _check_kl("delta", delta)
    for d in mean_tv:
        _check_tv("mean_tv[t]", d)
    return 4 * math.fsum(d * min(1.0, (T - t) * eps, math.sqrt((T - t) * delta / 2))
                         for t, d in enumerate(mean_tv, start=1))


def bound_table(T: int, delta: float, eps: float, seq_kl: float, seq_tv: float,
                mean_tv: Sequence[float] | None = None) -> dict[str, float]:
    """Every bound of algorithms.md §2.2 by name (the §2.6(c) table). `mean_tv` (the D̄_t profile)
    adds the Adaptive bound; its length must be T."""
    if mean_tv is not None and len(mean_tv) != T:
        raise ValueError(f"mean_tv must hold one D̄_t per position (T={T}), got {len(mean_tv)}")
    table = {
        "classical_kl": classical_bound_kl(T, delta),
        "classical_tv": classical_bound_tv(T, eps),
        "pinsker_marginal_kl": pinsker_marginal_kl(T, delta),
        "pinsker_marginal_tv": pinsker_marginal_tv(T, eps, delta),
        "mixed_kl": mixed_kl(T, delta, seq_kl),
        "mixed_tv": mixed_tv(T, eps, seq_tv),
        "coupling": coupling(T, eps),
    }
    if mean_tv is not None:
        table["adaptive"] = adaptive(mean_tv, eps, delta)
    return table


def unified_bound(T: int, delta: float, eps: float, seq_kl: float, seq_tv: float,
                  mean_tv: Sequence[float] | None = None) -> float:
    """Unified bound (TRM, algorithms.md §2.2 last row):
    B* = min{B_PM^KL, B_PM^TV, B_Mix^KL, B_Mix^TV, B_Coup, B_Adap^*}; L(π_θ) > B* ⇒ J(π_θ) > J(π_roll).
    The classical bounds are not part of the minimum (they are the baseline it improves on)."""
    table = bound_table(T, delta, eps, seq_kl, seq_tv, mean_tv)
    return min(v for k, v in table.items() if not k.startswith("classical"))
