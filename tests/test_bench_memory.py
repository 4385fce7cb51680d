"""bench/memory.py, run mode, as docs/benchmarks.md runs it: `agentrl train` under the RSS poller
prints one JSON line with the peak and a breakdown (slow: a real one-step run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_train_e2e import TINY

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


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
