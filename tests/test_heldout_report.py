"""Held-out evaluation records (issue 13): valid-call rate, the report's held-out plot with the
warm-start boundary, and the table of phases."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.evaluate import heldout_line, summarize_trajectories, valid_call_rate
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


def test_bench_multi_turn_gain_ci_is_newcombes() -> None:
    import importlib.util
    import sys

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "bench"))
    spec = importlib.util.spec_from_file_location("bench_multiturn", root / "bench" / "_multiturn.py")
    mt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mt)
    lo, hi = mt.newcombe_diff_ci(56 / 70, 70, 48 / 80, 80)  # Newcombe (1998) table II, example (a)
    assert abs(lo - 0.0524) < 5e-4 and abs(hi - 0.3339) < 5e-4
    lo, hi = mt.newcombe_diff_ci(0.5, 10, 0.5, 10)
    assert lo < 0 < hi and abs(lo + hi) < 1e-12
