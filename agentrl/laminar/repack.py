"""Best-Fit trajectory consolidation (Laminar, arXiv 2510.12633, Algorithm 1; algorithms.md §1.4).

Pure: the rollout manager builds one `RolloutLoad` per worker of one weight-version group and
turns the returned (source, destination) plan into trajectory moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RolloutLoad:
    """Capacity indicators of one rollout at a repack check (algorithms.md §1.4).

    `c_used` is the KV-cache utilisation in [0, 1] (tokens in flight / capacity on CPU),
    `c_prev` its value at the previous check, `n_reqs` the trajectories it holds.
    """

    id: str
    c_used: float
    c_prev: float
    n_reqs: int


def repack_candidates(rollouts: Sequence[RolloutLoad], c_max: float, b: int) -> list[RolloutLoad]:
    """The ramp-down set S of Algorithm 1, smallest footprint first.

    A rollout is a candidate when its utilisation is strictly falling below both `c_max` and
    its previous value (the strict `<` of the pseudocode, §1.4 [AMBIGUOUS]) and it holds fewer
    than `b` trajectories. Ties keep the input order (stable sort), so plans are deterministic.
    """
    s = [r for r in rollouts if r.c_used < min(c_max, r.c_prev) and r.n_reqs < b]
    return sorted(s, key=lambda r: r.c_used)


def best_fit_repack(rollouts: Sequence[RolloutLoad], c_max: float, b: int) -> list[tuple[str, str]]:
    """Algorithm 1 (Best-Fit Trajectory Consolidation) of Laminar, algorithms.md §1.4.

    Returns the plan P as (source id, destination id) pairs: every trajectory of a source moves
    to its destination, and the source is released to pull new weights. Each source goes to
    the destination that is densest after the move among those it fits on (C_load + s.C_used
    ≤ c_max and N_load + s.N_reqs ≤ b). [INFERRED] guard: a rollout that has received work
    in P is never chosen as a source, and a source is never a destination. O(|S|²).
    """
    if not 0.0 < c_max <= 1.0:
        raise ValueError(f"c_max must be in (0, 1], got {c_max}")
    if b < 1:
        raise ValueError(f"b (the roofline batch bound) must be >= 1, got {b}")
    ids = [r.id for r in rollouts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"rollout ids must be unique, got {ids}")

    s_set = repack_candidates(rollouts, c_max, b)
    plan: list[tuple[str, str]] = []
    emptied: set[str] = set()
    received: dict[str, list[RolloutLoad]] = {}  # destination id -> sources moved onto it

    def load(d: RolloutLoad) -> tuple[float, int]:
        moved = received.get(d.id, [])
        return d.c_used + sum(s.c_used for s in moved), d.n_reqs + sum(s.n_reqs for s in moved)

    def can_fit(d: RolloutLoad, s: RolloutLoad) -> bool:
        c_load, n_load = load(d)
        return c_load + s.c_used <= c_max and n_load + s.n_reqs <= b

    for s in s_set:
        if s.id in emptied or s.id in received:  # the guard: a destination stays put
            continue
        dests = [d for d in s_set if d.id not in emptied and d.id != s.id and can_fit(d, s)]
        if dests:
            best = max(dests, key=lambda d: load(d)[0])  # first maximum on ties
            plan.append((s.id, best.id))
            emptied.add(s.id)
            received.setdefault(best.id, []).append(s)
    return plan
