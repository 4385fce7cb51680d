"""bench/memory.py, run mode, as docs/benchmarks.md runs it: `agentrl train` under the RSS poller
prints one JSON line with the peak and a breakdown (slow: a real one-step run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_train_e2e import TINY

SLOW = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


@SLOW
def test_memory_bench_prints_the_peak_of_a_real_run() -> None:
    overrides = [o for o in TINY if not o.startswith("--")]
    out = subprocess.run([sys.executable, "bench/memory.py", "--env", "code", "--timeout", "600", "--",
                          "trainer.steps=1", *overrides], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert (line["bench"], line["mode"], line["exit_code"], line["timed_out"]) == ("memory", "run", 0, False)
    weights = line["breakdown_gb"]["learner_weights"]
    assert 0.4 < weights < 0.6  # the 135M model in fp32
    # at least the learner's and the rollout engine's weights were resident at once
    assert line["peak_rss_gb"] > 2 * weights and "load_avg" in line["machine"]
    # the phase timeline: the run marked its phases and the peak falls in one of them
    assert line["peak_phase"] in line["phases"] and {"load_model", "push", "rollout"} <= set(line["phases"])
    measured = line["measured_gb"]["max"]
    # the relay holds a whole copy, in the engines' precision: fp32 (W), or under a bf16 trainer
    # the linear weights in bf16 (0.61 W for this model; tests/test_engine_precision.py)
    assert abs(measured["learner_weights"] - weights) < 0.01 and measured["relay_buffers"] > 0.55 * weights
    # the rollout engine holds no weights of its own (it runs on the learner's parameters until the
    # first push, then on the relay's snapshot) but, under bf16 on CPU, each linear weight packed
    # for oneDNN, the tied LM head's cast included (agentrl/inference/packed_linear.py):
    # 134.5M weights in bf16 = 0.2505 GiB
    assert 0.24 < measured["engine_weights"] < 0.27


@pytest.mark.parametrize("timeout", [600, 3])
def test_memory_bench_wraps_any_command_and_kills_its_tree_on_timeout(tmp_path: Path, timeout: int) -> None:
    # a grandchild holds 400 MB for 6 s: the poller must see it, and a 3 s timeout must kill it
    hold = f"{sys.executable} -c 'import time; b = bytearray(400 << 20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(6)'"
    out = subprocess.run([sys.executable, str(ROOT / "bench/memory.py"), "--timeout", str(timeout), "--command",
                          f"{hold}; echo done >&2"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert line["mode"] == "command" and line["cwd"] == str(tmp_path)
    assert line["peak_rss_gb"] > 0.35
    # the 400 MB is the grandchild's, not the top process's (bash): reported apart
    assert line["peak_children_rss_gb"] > 0.35 > 0.1 > line["peak_process_rss_gb"]
    if timeout == 3:
        assert line["timed_out"] and line["exit_code"] != 0 and line["wall_s"] < 6
    else:
        assert not line["timed_out"] and line["exit_code"] == 0 and line["stderr_tail"] == ["done"]


def test_phase_timeline_names_the_phase_that_peaked_and_the_components_there(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from agentrl import phases
    from bench.memory import GB, phase_timeline

    log = tmp_path / "phases.jsonl"
    monkeypatch.setenv(phases.PHASE_LOG_ENV, str(log))
    monkeypatch.setattr(phases, "_tracked", [])

    class Owner:
        def __init__(self) -> None:
            self.a = torch.zeros(1 << 18)  # 1 MiB
            self.view = self.a[10:]  # the same storage: counted once

    owner = Owner()
    # the viewer is tracked first (an engine built before the relay): the owner still claims it
    phases.track("copies", owner, lambda o: [o.view, None], views=True)
    phases.track("weights", owner, lambda o: [o.a])
    phases.mark_phase("rollout")
    with phases.phase("learner_step"):
        pass
    marks = [json.loads(line) for line in log.read_text().splitlines()]
    assert [m["phase"] for m in marks] == ["rollout", "learner_step", "rollout"]
    assert marks[0]["components"] == {"weights": 1 << 20, "copies": 0} and marks[0]["rss"] > 0
    for m in marks:  # the RSS each mark carries counts as a sample: pin it below the samples' (this
        m["rss"] = GB // 4  # process's own may be GBs after a long test session)
    # samples: 1 GB in rollout, 3 GB in the learner step, 2 GB after it
    for i, m in enumerate(marks):  # marks 10 s apart
        m["t"] = 1000.0 + 10 * i
    t = [m["t"] for m in marks]
    samples = [(t[0] - 1, GB // 2), (t[0] + 1, GB), (t[1] + 1, 3 * GB), (t[2] + 1, 2 * GB)]
    out = phase_timeline(samples, marks, str(tmp_path / "timeline.jsonl"))
    assert out["peak_phase"] == "learner_step"
    assert out["phases"]["learner_step"]["peak_gb"] == 3.0 and out["phases"]["rollout"]["peak_gb"] == 2.0
    assert [s["phase"] for s in out["timeline"]] == ["startup", "rollout", "learner_step", "rollout"]
    assert out["measured_gb"]["at_peak_start"]["weights"] == round((1 << 20) / GB, 3)
    assert len((tmp_path / "timeline.jsonl").read_text().splitlines()) == 4
    # a phase shorter than the poll interval (no RSS sample inside it) still shows, at its mark's RSS
    short = [dict(marks[0]), {**marks[1], "phase": "push", "t": t[0] + 1.05}, {**marks[2], "t": t[0] + 1.1}]
    out = phase_timeline([(t[0] - 1, GB // 2), (t[0] + 1, GB), (t[0] + 1.2, GB)], short)
    assert out["phases"]["push"]["peak_gb"] == 0.25
    assert [s["phase"] for s in out["timeline"]] == ["startup", "rollout", "push", "rollout"]
    del owner  # a freed owner is no longer counted
    assert phases.component_bytes() == {}
