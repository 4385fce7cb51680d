"""Held-out evaluation records (issue 13): valid-call rate, the report's held-out plot with the
warm-start boundary, and the table of phases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.evaluate import (
    group_changes,
    heldout_line,
    paired_difference_interval,
    rl_gain,
    success_by_group,
    success_counts,
    summarize_trajectories,
    task_mean_interval,
    task_rate_interval,
    valid_call_rate,
    wilson_interval,
)
from agentrl.report import write_report
from agentrl.types import Segment, Status, Trajectory, Turn


def _traj(valid: list[bool], success: bool) -> Trajectory:
    seg = Segment(turns=[Turn("a", 0, 1, reward_components={"valid_call": 0.01 * v}) for v in valid])
    return Trajectory(id="t", group_id="g", task_id="x", segments=[seg], status=Status.FINISHED,
                      outcome_reward=float(success), reward_components={"reward": float(success)})


def test_valid_call_rate_counts_turns_and_falls_back_to_tool_errors() -> None:
    trajs = [_traj([True, False, True], True), _traj([False], False)]
    assert valid_call_rate(trajs) == 0.5
    res = summarize_trajectories(trajs)
    assert res.valid_call_rate == 0.5 and res.successes == 1 and 0 < res.ci_low < 0.5 < res.ci_high < 1
    bare = Trajectory(id="u", group_id="g", task_id="y", segments=[Segment(turns=[
        Turn("a", 0, 1, tool_calls=1), Turn("b", 1, 2, tool_calls=1, tool_errors=1), Turn("c", 2, 3)])])
    assert valid_call_rate([bare]) == 1 / 3  # an env without the valid_call signal


def test_report_plots_heldout_success_with_the_warm_start_boundary(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward_mean": 0.1, "success_rate": 0.2}) + "\n")
    evals = [{"phase": p, "step": s, "split": "test", "heldout_n": 32, "heldout_success": y, "heldout_ci_low": y / 2,
              "heldout_ci_high": min(1.0, y + 0.2), "heldout_turns_mean": 2.0, "heldout_valid_call_rate": v,
              "eval_s": 10.0, "wall_s": w}
             for p, s, y, v, w in [("base", 0, 0.0, 0.2, 10), ("warm_start", 0, 0.4, 0.9, 90), ("final", 4, 0.6, 1.0, 300)]]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    (tmp_path / "warm_start.jsonl").write_text("".join(json.dumps({"step": i, "sft_loss": 2.0 - i}) + "\n" for i in range(3)))
    out = write_report(tmp_path)
    assert (out / "heldout.png").stat().st_size > 5000 and (out / "warm_start.png").stat().st_size > 3000
    page = (out / "index.html").read_text()
    assert "held-out evaluation" in page and "warm_start" in page and "0.600" in page and "heldout.png" in page
    assert heldout_line(evals[-1]) == ("held-out success 0.600 (95% CI 0.300–0.800, n=32), turns 2.00, "
                                       "valid calls 1.00")


def _bench_multiturn():
    import importlib.util
    import sys

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "bench"))
    spec = importlib.util.spec_from_file_location("bench_multiturn", root / "bench" / "_multiturn.py")
    mt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mt)
    return mt


def test_bench_multi_turn_gain_ci_is_newcombes() -> None:
    mt = _bench_multiturn()
    lo, hi = mt.newcombe_diff_ci(56 / 70, 70, 48 / 80, 80)  # Newcombe (1998) table II, example (a)
    assert abs(lo - 0.0524) < 5e-4 and abs(hi - 0.3339) < 5e-4
    lo, hi = mt.newcombe_diff_ci(0.5, 10, 0.5, 10)
    assert lo < 0 < hi and abs(lo + hi) < 1e-12


def test_bench_multi_turn_heldout_samples_evaluate_at_the_sampling_temperature(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentrl.plan

    mt = _bench_multiturn()
    seen: list[list[str]] = []

    def prepare_run(env: str, overrides: list[str]):
        seen.append(overrides)
        raise SystemExit  # stop before any work: the overrides are what this test reads

    monkeypatch.setattr(agentrl.plan, "prepare_run", prepare_run)
    for samples, extra in ((4, []), (1, []), (3, ["sampling.temperature=0.5"]), (2, ["eval.temperature=1.0"])):
        with pytest.raises(SystemExit):
            mt.run_env("search", 8, None, extra, None, heldout_samples=samples)
    with_k = [[o for o in ov if o.startswith("eval.samples=") or o.startswith("eval.temperature=")] for ov in seen]
    # search.yaml samples at T = 0.7; a later override of eval.temperature wins
    assert with_k == [["eval.samples=4", "eval.temperature=0.7"], [], ["eval.samples=3", "eval.temperature=0.5"],
                      ["eval.samples=2", "eval.temperature=0.7", "eval.temperature=1.0"]]


def test_bench_multi_turn_pools_seeds_over_seeds_and_over_tasks() -> None:
    mt = _bench_multiturn()
    mean, lo, hi = mt.mean_t_ci95([1.0, 2.0, 3.0])  # sd 1, t(2) = 4.303: 2 ± 4.303 / √3
    assert mean == 2.0 and abs(lo + 0.4844) < 1e-4 and abs(hi - 4.4844) < 1e-4
    with pytest.raises(ValueError, match="at least 2"):
        mt.mean_t_ci95([0.5])

    def record(warm: dict[str, int], final: dict[str, int]) -> dict:
        return {"env": "search", "rl_gain": (sum(final.values()) - sum(warm.values())) / len(warm),
                "heldout_warm": sum(warm.values()) / len(warm), "heldout_rl": sum(final.values()) / len(final),
                "wall_s": {"total": 100.0}, "_outcomes": {"base": dict.fromkeys(warm, 0), "warm_start": warm,
                                                          "final": final}}

    pooled = mt.pool_seeds([record({"a": 0, "b": 1, "c": 0}, {"a": 1, "b": 1, "c": 0}),    # +1/3
                            record({"a": 0, "b": 0, "c": 1}, {"a": 1, "b": 1, "c": 1})])   # +2/3
    assert pooled["seeds"] == 2 and pooled["tasks"] == 3 and abs(pooled["rl_gain_mean"] - 0.5) < 1e-12
    lo, hi = pooled["rl_gain_seeds_ci95"]  # sd √2/6 over 2 seeds, t(1) = 12.706
    assert abs(hi - 0.5 - 12.706 * (2 ** 0.5 / 6) / 2 ** 0.5) < 1e-9 and abs(lo + hi - 1.0) < 1e-9
    lo, hi = pooled["rl_gain_tasks_ci95"]  # per task 1, 0.5, 0: sd 0.5, t(2) = 4.303
    assert abs(hi - 0.5 - 4.303 * 0.5 / 3 ** 0.5) < 1e-9


def test_paired_interval_matches_newcombes_method_10() -> None:
    # Cavo et al. (2012) as worked in Fagerland, Lydersen & Laake, "Statistical analysis of
    # contingency tables", ch. 8: 59 both, 6 after only, 16 before only, 80 neither.
    before = [1] * 59 + [0] * 6 + [1] * 16 + [0] * 80
    after = [1] * 59 + [1] * 6 + [0] * 16 + [0] * 80
    lo, hi = paired_difference_interval(before, after)
    assert abs(lo + 0.1186) < 5e-5 and abs(hi + 0.0046) < 5e-5


def test_pairing_narrows_the_interval_when_tasks_agree() -> None:
    # 32 tasks, 17 solved before; after, the same 17 and 5 more: the paired interval excludes 0
    # where the two-sample one (tasks treated as fresh draws) does not.
    before = [1] * 17 + [0] * 15
    after = [1] * 22 + [0] * 10
    lo, hi = paired_difference_interval(before, after)
    assert 0 < lo < 5 / 32 < hi
    l1 = wilson_interval(22, 32)[0]
    u2 = wilson_interval(17, 32)[1]
    two_sample_lo = 5 / 32 - ((22 / 32 - l1) ** 2 + (u2 - 17 / 32) ** 2) ** 0.5
    assert two_sample_lo < 0 < lo
    swapped = paired_difference_interval(after, before)  # swapping the roles mirrors it
    assert abs(swapped[0] + hi) < 1e-12 and abs(swapped[1] + lo) < 1e-12


def test_rl_gain_pairs_final_with_the_warm_start_and_the_report_prints_it(tmp_path: Path) -> None:
    def rec(phase: str, outcomes: dict[str, int]) -> dict:
        y = sum(outcomes.values()) / len(outcomes)
        return {"phase": phase, "step": 2, "split": "test", "heldout_n": len(outcomes), "heldout_success": y,
                "heldout_ci_low": 0.0, "heldout_ci_high": 1.0, "heldout_turns_mean": 1.0,
                "heldout_valid_call_rate": 1.0, "eval_s": 1.0, "wall_s": 1.0, "heldout_outcomes": outcomes}

    ids = [f"t{i}" for i in range(8)]
    records = [rec("base", dict.fromkeys(ids, 0)), rec("warm_start", {i: int(i < "t4") for i in ids}),
               rec("final", {i: int(i < "t6") for i in ids})]
    gain = rl_gain(records)
    assert gain is not None and (gain["from"], gain["to"], gain["n"]) == ("warm_start", "final", 8)
    assert (gain["gained"], gain["lost"]) == (2, 0) and gain["gain"] == 0.25
    assert gain["ci_low"] < 0.25 < gain["ci_high"]
    assert rl_gain(records[:2]) is None  # no final evaluation
    assert rl_gain([records[0], rec("final", {"other": 1})]) is None  # not the same tasks
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward_mean": 0.1}) + "\n")
    page = (write_report(tmp_path) / "index.html").read_text()
    assert "held-out gain warm_start → final: +0.250 (paired 95% CI" in page and "2 tasks gained, 0 lost" in page


def test_several_samples_a_task_take_the_interval_over_tasks_and_pair_the_rates(tmp_path: Path) -> None:
    # rates 0, 0.5, 1, 0.5: mean 0.5, s = sqrt(0.5 / 3), half-width 1.96 * s / 2 = 0.40008
    lo, hi = task_mean_interval([0.0, 0.5, 1.0, 0.5])
    assert abs(lo - 0.09992) < 1e-5 and abs(hi - 0.90008) < 1e-5
    assert task_mean_interval([0.5]) == (-1.0, 1.0)  # no spread to estimate from one task
    assert task_rate_interval([0.0, 0.5, 1.0, 0.5]) == (lo, hi)
    # every task at 0 (a base model): no spread, so Wilson's over the 48 tasks, not a zero width
    assert task_rate_interval([0.0] * 48) == wilson_interval(0, 48) and wilson_interval(0, 48)[1] > 0.07
    assert task_rate_interval([1.0] * 4) == wilson_interval(4, 4)
    # 4 episodes of each of 4 tasks; successes per task before 1, 2, 0, 4 and after 3, 2, 1, 4:
    # differences 0.5, 0, 0.25, 0: mean 0.1875, s = 0.23936, half-width 1.96 * s / 2 = 0.23457
    assert success_counts([("b", 1), ("a", 0), ("b", 1), ("a", 1)]) == {"a": 1, "b": 2}

    def rec(phase: str, counts: dict[str, int]) -> dict:
        y = sum(counts.values()) / (4 * len(counts))
        return {"phase": phase, "step": 3, "split": "test", "heldout_n": len(counts), "heldout_samples": 4,
                "heldout_success": y, "heldout_ci_low": 0.0, "heldout_ci_high": 1.0, "heldout_turns_mean": 1.0,
                "heldout_valid_call_rate": 1.0, "eval_s": 1.0, "wall_s": 1.0, "heldout_outcomes": counts}

    warm, final = rec("warm_start", {"a": 1, "b": 2, "c": 0, "d": 4}), rec("final", {"a": 3, "b": 2, "c": 1, "d": 4})
    gain = rl_gain([warm, final])
    assert gain is not None and abs(gain["gain"] - 0.1875) < 1e-12 and (gain["n"], gain["samples"]) == (4, 4)
    assert abs(gain["ci_low"] + 0.04707) < 1e-5 and abs(gain["ci_high"] - 0.42207) < 1e-5
    assert (gain["gained"], gain["lost"]) == (2, 0)
    assert "n=4×4" in heldout_line(final)
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (warm, final)))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward_mean": 0.1}) + "\n")
    page = (write_report(tmp_path) / "index.html").read_text()
    assert "+0.188 (paired 95% CI -0.047 to +0.422; 2 tasks gained, 0 lost, n=4×4)" in page


def test_successes_per_group_and_the_groups_rl_moved_reach_the_report(tmp_path: Path) -> None:
    group_of = {"a1": "alpha2", "a2": "alpha2", "b1": "numeric", "c1": "currency"}
    warm = {"a1": 0, "a2": 1, "b1": 1, "c1": 0}
    final = {"a1": 1, "a2": 1, "b1": 0, "c1": 0}
    by_warm, by_final = success_by_group(warm.items(), group_of), success_by_group(final.items(), group_of)
    assert by_warm == {"alpha2": {"successes": 1, "n": 2}, "currency": {"successes": 0, "n": 1},
                       "numeric": {"successes": 1, "n": 1}}
    assert list(by_final) == ["alpha2", "currency", "numeric"] and by_final["alpha2"]["successes"] == 2
    # `agentrl eval --n` beyond the split cycles its tasks: each episode counts
    assert success_by_group([("b1", 1), ("b1", 0), ("c1", 1)], group_of) == {
        "currency": {"successes": 1, "n": 1}, "numeric": {"successes": 1, "n": 2}}

    def rec(phase: str, outcomes: dict[str, int], by: dict | None) -> dict:
        return {"phase": phase, "step": 3, "split": "test", "heldout_n": 4,
                "heldout_success": sum(outcomes.values()) / 4, "heldout_ci_low": 0.0, "heldout_ci_high": 1.0,
                "heldout_turns_mean": 1.0, "heldout_valid_call_rate": 1.0, "eval_s": 1.0, "wall_s": 1.0,
                "heldout_outcomes": outcomes, **({"group_by": "kind", "heldout_by_group": by} if by else {})}

    before, after = rec("warm_start", warm, by_warm), rec("final", final, by_final)
    # the groups whose successes changed, in the order of their names; unchanged ones are left out
    assert group_changes(before, after) == ["alpha2 1/2 → 2/2", "numeric 1/1 → 0/1"]
    assert group_changes(rec("warm_start", warm, None), rec("final", final, None)) == []
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (before, after)))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward_mean": 0.1}) + "\n")
    page = (write_report(tmp_path) / "index.html").read_text()
    assert "by kind: alpha2 1/2 → 2/2, numeric 1/1 → 0/1" in page
    assert "held-out successes per kind" in page
    assert "<tr><td>alpha2</td><td>1/2</td><td>2/2</td></tr>" in page
    assert "<tr><td>currency</td><td>0/1</td><td>0/1</td></tr>" in page
