"""SWE task synthesis throughput and the shipped task set (issue 18).

    .venv/bin/python bench/swe_synth.py [--packages six,toolz] [--max-tasks 6] [--workers N] [--reports DIR/report.json ...]

Synthesises and validates tasks from `--packages` on the local backend with their runtimes and
sdists prepared first (the timed part is mutation, the synthesiser's two test runs per kept bug
and validation from scratch: gold patch 1, empty patch 0), on `--workers` sandboxes at once
(default: one per core, as `agentrl swe synth`). `--reports` adds the per-package reports of
earlier `agentrl swe synth --packages` runs to the package and operator counts.

Prints one JSON line: packages_tried, packages_with_tasks, tasks_proposed, tasks_valid,
validation_pass_rate_per_operator (valid / proposed), tasks_valid_per_min (this run, runtimes
built), shipped_tasks, shipped_packages, shipped_data_bytes, and the load average at start and end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from agentrl.config import SandboxConfig
from agentrl.envs.swe.batch import PackageResult, resolve_spec, synthesize_package
from agentrl.envs.swe.runtime import RuntimeSpec, default_workers, ensure_runtime
from agentrl.envs.swe.schema import DATA_DIR, builtin_tasks
from agentrl.envs.swe.source import analyse_repo, fetch_sdist, unpack


def _prepare(spec: str, out: Path) -> str:
    """Resolve, download and build the runtime of `spec` (untimed: the target is 'runtimes built')."""
    spec = resolve_spec(spec, out)
    archive = fetch_sdist(spec, out)
    with tempfile.TemporaryDirectory() as tmp:
        pythonpath = tuple(analyse_repo(unpack(archive, Path(tmp))).pythonpath)
    ensure_runtime(RuntimeSpec(spec, str(archive), pythonpath))
    return spec


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--packages", default="six", help="comma-separated NAME or NAME==VERSION")
    p.add_argument("--max-tasks", type=int, default=6)
    p.add_argument("--max-candidates", type=int, default=60)
    p.add_argument("--budget-s", type=float, default=200.0, help="per package")
    p.add_argument("--workers", type=int, default=default_workers(), help="sandboxes running tests at once")
    p.add_argument("--reports", nargs="*", default=[], help="report.json files of earlier batch runs")
    args = p.parse_args()
    load_start = os.getloadavg()[0]
    cfg = SandboxConfig(backend="local", timeout_s=60.0, memory_mb=2048, pids=256, max_output_bytes=8_000_000)
    results: list[PackageResult] = []
    timed_s = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for raw in [s.strip() for s in args.packages.split(",") if s.strip()]:
            try:
                spec = _prepare(raw, out)
            except Exception as e:
                results.append(PackageResult(raw, why=f"{type(e).__name__}: {e}"[:300]))
                continue
            start = time.perf_counter()
            results.append(asyncio.run(synthesize_package(
                spec, cfg, out, max_tasks=args.max_tasks, max_candidates=args.max_candidates,
                time_budget_s=args.budget_s, workers=args.workers, log=lambda *a: print(*a, file=sys.stderr))))
            timed_s += time.perf_counter() - start
    valid_now = sum(r.valid for r in results)
    for path in args.reports:
        results += [PackageResult(**r) for r in json.loads(Path(path).read_text()).values()]
    proposed: dict[str, int] = {}
    valid: dict[str, int] = {}
    for r in results:
        for op, n in r.ops_proposed.items():
            proposed[op] = proposed.get(op, 0) + n
        for op, n in r.ops_valid.items():
            valid[op] = valid.get(op, 0) + n
    shipped = builtin_tasks("all")
    data_bytes = sum(f.stat().st_size for f in DATA_DIR.rglob("*") if f.is_file())
    print(json.dumps({
        "packages_tried": len(results), "packages_with_tasks": sum(1 for r in results if r.valid),
        "tasks_proposed": sum(r.proposed for r in results), "tasks_valid": sum(r.valid for r in results),
        "validation_pass_rate_per_operator": {op: round(valid.get(op, 0) / n, 3) for op, n in sorted(proposed.items())},
        "tasks_valid_per_min": round(valid_now / (timed_s / 60), 2) if timed_s else 0.0,
        "timed_s": round(timed_s, 1), "workers": args.workers,
        "no_task": {r.package: r.why for r in results if not r.valid},
        "shipped_tasks": len(shipped),
        "shipped_packages": len({t["environment_setup"].get("package") for t in shipped}),
        "shipped_data_bytes": data_bytes,
        "load_start": round(load_start, 2), "load_end": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
