"""Best-Fit trajectory consolidation (Laminar, arXiv 2510.12633, Algorithm 1; algorithms.md §1.4).

Pure: the rollout manager builds one `RolloutLoad` per worker of one weight-version group and
turns the returned (source, destination) plan into trajectory moves.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import NamedTuple


class RolloutLoad(NamedTuple):
    """Capacity indicators of one rollout at a repack check (algorithms.md §1.4).

    `c_used` is the KV-cache utilisation in [0, 1] (tokens in flight / capacity on CPU),
    `c_prev` its value at the previous check, `n_reqs` the trajectories it holds. A named tuple:
    a decision builds one per worker, 1,024 of them at cluster scale, and a frozen dataclass
    costs several times as much to build (most of a decision's time, bench/controller.py).
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
    in P is never chosen as a source, and a source is never a destination. O(|S| log |S|) when
    sources fit the densest destinations they can reach (O(|S|²) at worst).
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
    received: set[str] = set()  # destinations that took sources
    moved_c = {r.id: 0.0 for r in s_set}  # C_used moved onto each destination, summed in plan order
    n_load = {r.id: r.n_reqs for r in s_set}

    def key(d: RolloutLoad, i: int) -> tuple[float, int, str]:
        return (d.c_used + moved_c[d.id], -i, d.id)

    # The destinations by C_load, ascending; on ties the earlier rollout sorts later. The densest
    # one a source fits on is the first fitting one walking down from the last C_load that can
    # fit: O(|S| log |S|) a plan where a scan of every destination per source took 0.6 s at 1,024.
    pos = {r.id: i for i, r in enumerate(s_set)}
    by_load = sorted(key(d, i) for i, d in enumerate(s_set))
    for s in s_set:
        if s.id in emptied or s.id in received:  # the guard: a destination stays put
            continue
        # (the margin covers rounding; each destination below is checked exactly)
        top = bisect.bisect_right(by_load, (c_max - s.c_used + 1e-9, math.inf, ""))
        best = next((j for j in range(top - 1, -1, -1) if by_load[j][2] != s.id
                     and by_load[j][0] + s.c_used <= c_max and n_load[by_load[j][2]] + s.n_reqs <= b), None)
        if best is None:
            continue
        dest = by_load.pop(best)[2]
        del by_load[bisect.bisect_left(by_load, key(s, pos[s.id]))]
        plan.append((s.id, dest))
        emptied.add(s.id)
        received.add(dest)
        moved_c[dest] += s.c_used
        n_load[dest] += s.n_reqs
        bisect.insort(by_load, key(s_set[pos[dest]], pos[dest]))
    return plan
