"""AReaL staleness control (arXiv 2505.24298 §5, algorithms.md §8.2) as pure functions.

With training batch size B and maximum staleness η, the N_r-th generation request (counting it)
lands in training batch ⌊(N_r − 1)/B⌋ when batches are formed in request order (oldest first,
waiting for them). Batch j is trained by policy version j, so a request admitted at version i is
at most j − i ≤ η versions stale. If instead batches take whatever finished first, a straggler
can be arbitrarily stale; the rule then only caps the submitted-but-unconsumed backlog at
(η + 1)·B (tests/trainer/test_staleness.py shows both).
Laminar itself sets no bound (§1.3); this is the rollout-side admission rule for an η-bounded run.
AReaL's `StalenessManager` computes the same capacity, (η + i + 1)·B − (accepted + running).
"""

from __future__ import annotations


def _check(batch_size: int, max_staleness: int, version: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size B must be >= 1, got {batch_size}")
    if max_staleness < 0:
        raise ValueError(f"max_staleness η must be >= 0 (0 is synchronous RL), got {max_staleness}")
    if version < 0:
        raise ValueError(f"policy version must be >= 0, got {version}")


def batch_index(n_requests: int, batch_size: int) -> int:
    """⌊(N_r − 1)/B⌋: the training batch the N_r-th request (1-based) falls into (§8.2)."""
    if n_requests < 1:
        raise ValueError(f"N_r counts the request being admitted, so it must be >= 1, got {n_requests}")
    if batch_size < 1:
        raise ValueError(f"batch_size B must be >= 1, got {batch_size}")
    return (n_requests - 1) // batch_size


def admits(n_requests: int, version: int, batch_size: int, max_staleness: int) -> bool:
    """AReaL admission rule (algorithms.md §8.2): a new generation request, the N_r-th in total,
    is admitted at policy version i only if ⌊(N_r − 1)/B⌋ ≤ i + η."""
    _check(batch_size, max_staleness, version)
    return batch_index(n_requests, batch_size) <= version + max_staleness


def max_admitted(version: int, batch_size: int, max_staleness: int) -> int:
    """Largest total N_r admitted by version i: (i + η + 1)·B (§8.2 test: B=4, η=1 → 8, 12)."""
    _check(batch_size, max_staleness, version)
    return (version + max_staleness + 1) * batch_size
