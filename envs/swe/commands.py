"""`agentrl swe build` and `agentrl swe stats` (the parsers live in synth.main with synth/validate)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from .schema import resolve_tasks


def _tasks(path: str | None, default: str = "core") -> list[dict[str, Any]]:
    return resolve_tasks(path or default)


def build_cli(args: argparse.Namespace) -> int:
    """Prepare every runtime a task set needs (local backend: venvs; docker: per-package images),
    in parallel, with a progress bar, then a summary of what failed and why."""
    from . import runtime as rt

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
    from .synth import ensure_task_image

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
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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
    from .env import _split_of as split_of

    packages = Counter(t.get("environment_setup", {}).get("package") or t.get("repo") or "?" for t in tasks)
    splits = Counter(split_of(t) for t in tasks)
    operators = Counter((t.get("mutation") or {}).get("operator", "none") for t in tasks)
    split_packages: dict[str, set[str]] = {}
    for t in tasks:
        split_packages.setdefault(split_of(t), set()).add(t.get("environment_setup", {}).get("package", "?"))
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
