"""Best-Fit repack, Algorithm 1 of Laminar (algorithms.md §1.4, §1.8 test 2)."""

import random

import pytest

from agentrl.laminar.repack import RolloutLoad, best_fit_repack, repack_candidates

TABLE = [
    RolloutLoad("r1", 0.10, 0.15, 4),
    RolloutLoad("r2", 0.30, 0.35, 10),
    RolloutLoad("r3", 0.50, 0.60, 20),
    RolloutLoad("r4", 0.99, 0.99, 200),
    RolloutLoad("r5", 0.70, 0.65, 30),
]


def test_candidates_of_the_worked_example():
    assert [r.id for r in repack_candidates(TABLE, 0.99, 64)] == ["r1", "r2", "r3"]


def test_worked_example_plan():
    plan = best_fit_repack(TABLE, c_max=0.99, b=64)
    assert plan == [("r1", "r3"), ("r2", "r3")]
    loads = {r.id: r for r in TABLE}
    c = loads["r3"].c_used + sum(loads[s].c_used for s, d in plan if d == "r3")
    n = loads["r3"].n_reqs + sum(loads[s].n_reqs for s, d in plan if d == "r3")
    assert c == pytest.approx(0.90) and n == 34


def test_strict_less_than_excludes_a_plateau():
    flat = [RolloutLoad("a", 0.2, 0.2, 3), RolloutLoad("b", 0.3, 0.4, 3)]
    assert [r.id for r in repack_candidates(flat, 0.99, 64)] == ["b"]
    assert best_fit_repack(flat, 0.99, 64) == []  # one candidate: no plan


def test_destination_is_never_a_source():
    # a → c; b cannot fit onto c any more and must not take c's load either
    rs = [RolloutLoad("a", 0.1, 0.2, 1), RolloutLoad("b", 0.45, 0.5, 1), RolloutLoad("c", 0.5, 0.6, 1)]
    plan = best_fit_repack(rs, 0.99, 64)
    assert plan == [("a", "c"), ("b", "c")] or all(s != d for s, d in plan)
    sources = {s for s, _ in plan}
    dests = {d for _, d in plan}
    assert not sources & dests


def test_guard_blocks_a_receiver_from_leaving():
    # x → y (densest), then y would fit onto z, but y received work: it must stay
    rs = [RolloutLoad("x", 0.05, 0.1, 1), RolloutLoad("y", 0.2, 0.3, 1), RolloutLoad("z", 0.1, 0.2, 1)]
    plan = best_fit_repack(rs, 0.99, 64)
    assert plan[0] == ("x", "y")
    assert all(s not in {d for _, d in plan} for s, _ in plan)


def test_batch_bound_limits_moves():
    rs = [RolloutLoad("a", 0.1, 0.2, 40), RolloutLoad("b", 0.2, 0.3, 40)]
    assert best_fit_repack(rs, 0.99, 64) == []
    assert best_fit_repack(rs, 0.99, 80) == [("a", "b")]


@pytest.mark.parametrize("kw", [{"c_max": 0.0, "b": 4}, {"c_max": 1.5, "b": 4}, {"c_max": 0.9, "b": 0}])
def test_bad_input(kw):
    with pytest.raises(ValueError, match=r"c_max|b "):
        best_fit_repack(TABLE, **kw)


def test_duplicate_ids():
    with pytest.raises(ValueError, match="unique"):
        best_fit_repack([TABLE[0], TABLE[0]], 0.99, 64)


def test_repack_inputs_groups_by_version_and_idle_rule():
    from agentrl.laminar.manager import repack_inputs
    from agentrl.laminar.worker import WorkerLoad

    def wl(name, version, n, c, peak, prev, pulling=False, held=False):
        return WorkerLoad(name, version, n, 0, c, peak, pulling, held, 0.0, prev)

    loads = [wl("a", 1, 3, 0.2, 0.5, 0.2), wl("b", 1, 2, 0.1, 0.4, 0.15), wl("c", 2, 4, 0.3, 0.3, 0.4),
             wl("d", 1, 0, 0.0, 0.0, 0.0), wl("e", 1, 5, 0.1, 0.9, 0.5, pulling=True),
             wl("f", 2, 5, 0.1, 0.9, 0.5, held=True)]
    fall = repack_inputs(loads)
    assert sorted(fall) == [1, 2] and [r.id for r in fall[1]] == ["a", "b"] and [r.id for r in fall[2]] == ["c"]
    assert [r.c_prev for r in fall[1]] == [0.5, 0.4]  # the plateau
    prev = repack_inputs(loads, "prev")
    assert [r.c_prev for r in prev[1]] == [0.2, 0.15]
    # a flat tail (tool wait) stays a candidate under "fall" only
    assert [r.id for r in repack_candidates(fall[1], 0.99, 64)] == ["b", "a"]
    assert [r.id for r in repack_candidates(prev[1], 0.99, 64)] == ["b"]
    with pytest.raises(ValueError, match="idle rule"):
        repack_inputs(loads, "sometimes")


def scan_every_destination(rollouts: list[RolloutLoad], c_max: float, b: int) -> list[tuple[str, str]]:
    """Algorithm 1 as the pseudocode reads: every destination scanned for every source (O(|S|²))."""
    s_set = repack_candidates(rollouts, c_max, b)
    plan: list[tuple[str, str]] = []
    received: dict[str, list[RolloutLoad]] = {}

    def load(d: RolloutLoad) -> tuple[float, int]:
        moved = received.get(d.id, [])
        return d.c_used + sum(s.c_used for s in moved), d.n_reqs + sum(s.n_reqs for s in moved)

    for s in s_set:
        if any(s.id == src for src, _ in plan) or s.id in received:
            continue
        dests = [d for d in s_set if d.id != s.id and all(d.id != src for src, _ in plan)
                 and load(d)[0] + s.c_used <= c_max and load(d)[1] + s.n_reqs <= b]
        if dests:
            best = max(dests, key=lambda d: load(d)[0])
            plan.append((s.id, best.id))
            received.setdefault(best.id, []).append(s)
    return plan


@pytest.mark.parametrize("seed", range(6))
def test_the_sorted_search_makes_the_plan_a_scan_of_every_destination_makes(seed):
    """The same plan, ties (equal C_used, first rollout wins) and the N bound included."""
    rng = random.Random(seed)
    b = rng.choice([5, 8, 64])
    rollouts = []
    for i in range(rng.choice([40, 200])):
        c = rng.choice([0.05, 0.1, 0.2]) if seed % 2 else rng.uniform(0.0, 0.5)
        rollouts.append(RolloutLoad(f"w{i}", c, c + rng.choice([0.0, 0.1]), rng.randint(1, 4)))
    c_max = rng.choice([0.6, 0.99])
    plan = best_fit_repack(rollouts, c_max, b)
    assert plan == scan_every_destination(rollouts, c_max, b)
    assert len(plan) > 0
