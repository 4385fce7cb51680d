"""Helpers shared by the bench scripts: machine facts and the one-JSON-line output."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"


def load_average() -> list[float] | None:
    """(1, 5, 15)-minute load averages: the machine is shared, so every figure carries them."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def cpu_info() -> dict[str, Any]:
    """The CPU's model and the vector extensions that decide the learner's precision (bf16 autocast
    is fast with AVX512-BF16 or AMX and over 10x slower than fp32 with AVX2 alone); Linux only."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in text.splitlines()[:40] if ":" in line)}
    flags = set(fields.get("flags", "").split())
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    return {"model": fields.get("model name", ""), "extensions": [f for f in wanted if f in flags]}


def machine_info() -> dict[str, Any]:
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            mem_gib = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return {"host": platform.node(), "cpus": os.cpu_count(), "cpu": cpu_info(), "mem_gib": mem_gib,
            "python": platform.python_version(), "platform": platform.platform(), "load_avg": load_average()}


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def emit(record: dict[str, Any]) -> str:
    """Print `record` as the script's one JSON line (flushed) and return it."""
    line = json.dumps(record, default=str)
    print(line, flush=True)
    return line
