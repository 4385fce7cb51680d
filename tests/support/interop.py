"""Running the CLI on a foreign env (tests/interop): the command as a user types it, in a subprocess.

    out = run_cli("train", "--env", "textarena:TicTacToe-v0", "trainer.steps=2", *TINY)
    line = one_error_line(run_cli("train", "--env", "textarena:X", env=without_packages(tmp_path, "textarena")))
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# The smallest training run that still goes through every box (tests/test_train_e2e.py's budget).
TINY = ["trainer.batch_groups=1", "trainer.dynamic_sampling=false", "rollout.group_size=2", "rollout.concurrency=2", "sampling.max_tokens=24",
        "trainer.micro_batch_size=2", "sandbox.pool_size=1", "trainer.warm_start.enabled=false",
        "eval.enabled=false", "--quiet"]


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def without_packages(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment whose Python cannot import `modules` (as if not installed): a sitecustomize
    that blocks them, first on PYTHONPATH."""
    site = tmp_path / "blocked_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}


def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    """The CLI's error: exactly one line on stderr, no traceback."""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    return lines[0]


def jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a run's JSONL file (metrics.jsonl, eval.jsonl, trajectories.jsonl, ...)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
