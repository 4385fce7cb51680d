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
    if timeout == 3:
        assert line["timed_out"] and line["exit_code"] != 0 and line["wall_s"] < 6
    else:
        assert not line["timed_out"] and line["exit_code"] == 0 and line["stderr_tail"] == ["done"]
