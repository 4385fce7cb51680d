"""`agentrl swe synth | validate | build | stats`: SWE task synthesis from packages, validation of a
task set (gold patch = 1, empty patch = 0), its runtimes and images built ahead, and its counts.

    agentrl swe synth --package inflection==0.5.1 --max-tasks 8 --out tasks.jsonl
    agentrl swe validate suite
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentrl.config import SandboxConfig

from . import runtime as rt
from .batch import diagnose, synthesize_many
from .grade import ValidationCache, validate_tasks
from .images import ensure_task_image
from .runtime import default_workers, spec_of, task_sandboxes
from .schema import DATA_DIR, resolve_tasks, save_tasks, task_split
from .source import fetch_sdist, parse_spec
from .synth import synthesize


def _sandbox_config(args: argparse.Namespace) -> SandboxConfig:
    return SandboxConfig(backend=args.backend, image=args.base_image, timeout_s=60.0, memory_mb=2048,
                         pids=256, max_output_bytes=8_000_000)


def main(argv: list[str] | None = None) -> int:
    """`synth --package NAME==VERSION [--max-tasks N] [--out FILE] [--validate]` (the default
    command, so `agentrl swe synth` can pass its arguments straight through) and
    `validate [FILE]` (the shipped tasks by default)."""
    parser = argparse.ArgumentParser(prog="agentrl swe", description="SWE task synthesis and validation")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("synth", help="synthesise bug-fix tasks from a package's sdist")
    which = s.add_mutually_exclusive_group(required=True)
    which.add_argument("--package", help="NAME==VERSION of a pure-Python package on PyPI")
    which.add_argument("--packages", help="many packages, comma-separated (NAME or NAME==VERSION), or @FILE with "
                                          "one a line: each validated, with a per-package report (--out-dir)")
    s.add_argument("--out-dir", default="swe-tasks", help="with --packages: where tasks, sdists and report.json go")
    s.add_argument("--package-budget-s", type=float, default=600.0, help="with --packages: stop trying "
                                                                         "mutations of a package after this long")
    s.add_argument("--max-tasks", type=int, default=8)
    s.add_argument("--max-candidates", type=int, default=200, help="mutations to try at most")
    s.add_argument("--max-failing", type=int, default=10, help="keep bugs that break at most this many tests")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default=None, help="output JSONL (default: <name>-<version>.jsonl); the sdist "
                                               "is copied beside it")
    s.add_argument("--validate", action="store_true", help="validate every task after writing it")
    v = sub.add_parser("validate", help="check gold patch = 1 and empty patch = 0 for every task")
    v.add_argument("file", nargs="?", default=None, help="task file, or a shipped set: core (default), suite, all")
    v.add_argument("--no-cache", action="store_true")
    b = sub.add_parser("build", help="prepare the task runtimes (local venvs / docker images) of a task set")
    b.add_argument("--tasks", default=None, help="task file, or a shipped set: core (default), suite, all")
    b.add_argument("--workers", type=int, default=2, help="runtimes built in parallel")
    st = sub.add_parser("stats", help="count tasks by package, split and mutation operator")
    st.add_argument("--tasks", default=None, help="task file, or a shipped set: core, suite, all (default)")
    st.add_argument("--json", action="store_true", help="one JSON object")
    for p in (s, v):
        p.add_argument("--workers", type=int, default=default_workers(),
                       help="sandboxes running tests at once (default: one per core, at most 4)")
    for p in (s, v, b):
        p.add_argument("--backend", choices=["local", "docker"], default="local")
        p.add_argument("--base-image", default="agentrl-base:bookworm")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or argv[0] not in ("synth", "validate", "build", "stats", "-h", "--help"):
        argv = ["synth", *argv]  # `agentrl swe synth` passes the arguments after "synth"
    args = parser.parse_args(argv)
    try:
        if getattr(args, "workers", 1) < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        if args.cmd in ("build", "stats"):
            return build_cli(args) if args.cmd == "build" else stats_cli(args)
        if args.cmd == "synth":
            return asyncio.run(_synth_cli(args))
        return asyncio.run(_validate_cli(args))
    except (ValueError, RuntimeError) as e:
        print(f"error: {diagnose(str(e))}", file=sys.stderr)  # one line: why this package gave no task
        return 1


async def _synth_cli(args: argparse.Namespace) -> int:
    if args.packages:
        return await _synth_many_cli(args)
    name, version = parse_spec(args.package)
    if args.max_tasks < 1:
        raise ValueError("--max-tasks must be >= 1")
    out = Path(args.out or f"{name}-{version}.jsonl").resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    archive = fetch_sdist(args.package, out.parent)  # the sdist ships beside the tasks
    ref = f"data:{archive.name}" if out.parent == DATA_DIR.resolve() else f"file:{archive}"
    tasks, stats = await synthesize(args.package, _sandbox_config(args), max_tasks=args.max_tasks,
                                    max_candidates=args.max_candidates, max_failing=args.max_failing,
                                    seed=args.seed, archive_dir=out.parent, source_ref=ref, workers=args.workers)
    save_tasks(tasks, out)
    print(f"wrote {len(tasks)} task(s) to {out}; tried {stats.tried} of {stats.candidates} mutations "
          f"(no failing test {stats.no_failure}, too many {stats.too_many_failures}, flaky {stats.flaky}, "
          f"timed out {stats.timed_out}) in {stats.seconds:.0f}s")
    if args.validate and tasks:
        args.file, args.no_cache = str(out), False
        return await _validate_cli(args)
    return 0 if tasks else 1


async def _validate_cli(args: argparse.Namespace) -> int:
    tasks = resolve_tasks(args.file)
    cfg = _sandbox_config(args)
    cache = ValidationCache(Path(tempfile.mkdtemp()) / "v.json") if args.no_cache else ValidationCache()
    valid, rejected = [], []

    def group_key(t: dict[str, Any]) -> str:  # tasks that share a sandbox: same image, same runtime
        return f"{t['image'] or cfg.image}|{spec_of(t).name}"

    for key in sorted({group_key(t) for t in tasks}):
        group = [t for t in tasks if group_key(t) == key]
        try:
            if cfg.backend == "docker":
                ensure_task_image(group[0], cfg.image)
            async with task_sandboxes(cfg, group[0], min(args.workers, len(group))) as sandboxes:
                ok, bad = await validate_tasks(group, sandboxes, cfg.backend, cache, log=print)
        except RuntimeError as e:  # the group's sandbox could not be made (an image or runtime that does not build)
            rejected += [(t["instance_id"], str(e)) for t in group]
            print(f"{key}: REJECTED {len(group)} task(s): {e}")
            continue
        valid += ok
        rejected += bad
    print(f"{len(valid)} valid, {len(rejected)} rejected")
    return 0 if not rejected else 1



async def _synth_many_cli(args: argparse.Namespace) -> int:
    text = Path(args.packages[1:]).read_text() if args.packages.startswith("@") else args.packages.replace(",", "\n")
    specs = [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]
    results = await synthesize_many(specs, _sandbox_config(args), Path(args.out_dir), max_tasks=args.max_tasks,
                                    max_candidates=args.max_candidates, seed=args.seed,
                                    time_budget_s=args.package_budget_s, workers=args.workers)
    print(f"{sum(r.valid for r in results)} valid task(s) from {sum(1 for r in results if r.valid)} of "
          f"{len(results)} package(s) in {args.out_dir}; per package: {Path(args.out_dir) / 'report.json'}")
    for r in results:
        if r.why:
            print(f"  {r.package}: no task: {r.why}")
    return 0 if any(r.valid for r in results) else 1


def _tasks(path: str | None, default: str = "core") -> list[dict[str, Any]]:
    return resolve_tasks(path or default)


def build_cli(args: argparse.Namespace) -> int:
    """Prepare every runtime a task set needs (local backend: venvs; docker: per-package images),
    in parallel, with a progress bar, then a summary of what failed and why."""
    tasks = _tasks(args.tasks)
    specs = rt.task_specs(tasks)
    if args.backend == "docker":
        return _build_images(tasks, args)
    print(f"{len(specs)} runtime(s) for {len(tasks)} task(s) in {rt.runtime_root()}", flush=True)
    with _Bar(len(specs), "runtimes") as bar:
        report = rt.ensure_runtimes(tasks, workers=args.workers, progress=bar.advance)
    print(f"{len(report.built)} built, {len(report.cached)} cached, {len(report.failed)} failed "
          f"in {report.seconds:.1f}s")
    for name, why in sorted(report.failed.items()):
        print(f"  FAILED {name}: {why}")
    return 1 if report.failed else 0


def _build_images(tasks: list[dict[str, Any]], args: argparse.Namespace) -> int:
    groups: dict[str, dict[str, Any]] = {}
    for t in tasks:
        groups.setdefault(t.get("image") or args.base_image, t)
    failed: dict[str, str] = {}
    with _Bar(len(groups), "images") as bar:
        for image, task in sorted(groups.items()):
            try:
                ensure_task_image(task, args.base_image)
                bar.advance(image, "ready")
            except Exception as e:
                failed[image] = f"{type(e).__name__}: {e}"
                bar.advance(image, "failed")
    print(f"{len(groups) - len(failed)} image(s) ready, {len(failed)} failed")
    for image, why in sorted(failed.items()):
        print(f"  FAILED {image}: {why}")
    return 1 if failed else 0


class _Bar:
    """A rich progress bar on a terminal; one line per item otherwise."""

    def __init__(self, total: int, what: str) -> None:
        self.total, self.what, self.done = total, what, 0
        self._progress: Any = None

    def __enter__(self) -> _Bar:
        if sys.stdout.isatty():
            self._progress = Progress(TextColumn(f"{self.what}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("{task.description}"))
            self._progress.start()
            self._task = self._progress.add_task("", total=self.total)
        return self

    def advance(self, name: str, status: str) -> None:
        self.done += 1
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=f"{name}: {status}")
        else:
            print(f"[{self.done}/{self.total}] {name}: {status}", flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def stats(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts a task set by package, split and mutation operator."""
    packages = Counter(t.get("environment_setup", {}).get("package") or t.get("repo") or "?" for t in tasks)
    splits = Counter(task_split(t) for t in tasks)
    operators = Counter((t.get("mutation") or {}).get("operator", "none") for t in tasks)
    split_packages: dict[str, set[str]] = {}
    for t in tasks:
        split_packages.setdefault(task_split(t), set()).add(t.get("environment_setup", {}).get("package", "?"))
    return {"tasks": len(tasks), "packages": len(packages),
            "splits": {s: {"tasks": n, "packages": len(split_packages[s])} for s, n in sorted(splits.items())},
            "per_package": dict(sorted(packages.items())), "operators": dict(sorted(operators.items()))}


def stats_cli(args: argparse.Namespace) -> int:
    result = stats(_tasks(args.tasks, default="all"))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['tasks']} tasks from {result['packages']} packages")
    for split, row in result["splits"].items():
        print(f"  {split:6s} {row['tasks']:5d} tasks  {row['packages']:3d} packages")
    print("operators: " + ", ".join(f"{k} {v}" for k, v in result["operators"].items()))
    return 0
