"""SWE synthesis at scale: many packages, each task validated (gold patch 1, empty patch 0), and a
report per package of how many tasks it gave or why it gave none (issue 18).

    agentrl swe synth --packages six,toolz==0.12.1,... --out-dir DIR [--max-tasks 30]

Each package's tasks go to DIR/NAME-VERSION.jsonl.gz beside its sdist, and DIR/report.json holds
one entry per package. `ship()` copies a staging dir into the shipped suite (envs/swe/data/suite/),
pointing each task at its shipped sdist and assigning splits by package.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .grade import ValidationCache, split_patch, validate_tasks
from .runtime import task_sandboxes
from .schema import DATA_DIR, SUITE_DIR, load_tasks, save_tasks
from .source import fetch_sdist
from .synth import synthesize

_NETWORK = re.compile(r"(ConnectionError|Network is unreachable|Temporary failure in name resolution|"
                      r"Name or service not known|urlopen error|socket\.gaierror|MaxRetryError)")
_MISSING = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


@dataclass
class PackageResult:
    package: str
    proposed: int = 0  # tasks the synthesiser kept (the bug breaks 1..max_failing tests, twice)
    valid: int = 0  # of those, validated from scratch (gold 1, empty 0)
    tried: int = 0  # mutations tried
    ops_tried: dict[str, int] = field(default_factory=dict)
    ops_proposed: dict[str, int] = field(default_factory=dict)
    ops_valid: dict[str, int] = field(default_factory=dict)
    baseline_tests: int = 0
    seconds: float = 0.0
    why: str = ""  # why it gave no task (one line); empty when it gave some


def resolve_spec(spec: str, dest: Path) -> str:
    """NAME==VERSION as given, or for a bare NAME the version of the newest sdist pip picks."""
    if "==" in spec:
        return spec
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-q",
                            "--disable-pip-version-check", "-d", tmp, spec], capture_output=True, text=True,
                           timeout=600)
        files = list(Path(tmp).iterdir())
        if r.returncode != 0 or len(files) != 1:
            raise RuntimeError(f"pip found no sdist of {spec}: {_tail(r.stderr or r.stdout)}")
        m = re.match(r"^(.+?)-(\d[^-]*?)(\.tar\.gz|\.zip|\.tar\.bz2)$", files[0].name)
        if not m:
            raise RuntimeError(f"cannot read the version of {spec} from {files[0].name}")
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(files[0], dest / files[0].name)
        return f"{spec}=={m.group(2)}"


def diagnose(error: str) -> str:
    """One line saying why a package gave no task, from the error the pipeline raised."""
    text = " ".join(error.split())
    tamper = re.search(r"\[agentrl grader: tampering with the test run: ([^\]]+)\]", error)
    if tamper:
        return f"the grader flags its own tests as tampering ({tamper.group(1)})"
    if "no test passes on the unmodified package" in error:
        if _NETWORK.search(error):
            return "its tests need the network (sandboxes have none)"
        missing = _MISSING.search(error)
        if missing:
            return (f"its tests import {missing.group(1)!r}, which the package does not declare as a test "
                    "dependency")
        return "no test passes on the unmodified package: " + text[-300:]
    return text[:400]


async def synthesize_package(spec: str, cfg: Any, out_dir: Path, *, max_tasks: int, max_candidates: int,
                             max_failing: int = 10, seed: int = 0, log: Any = print,
                             time_budget_s: float = 600.0, workers: int = 1) -> PackageResult:
    """Synthesise and validate one package's tasks into out_dir, on `workers` sandboxes at once;
    never raises for the package's own problems (they become `why`)."""
    start = time.perf_counter()
    result = PackageResult(spec)
    try:
        spec = result.package = resolve_spec(spec, out_dir)
        archive = fetch_sdist(spec, out_dir)
        tasks, stats = await synthesize(spec, cfg, max_tasks=max_tasks, max_candidates=max_candidates,
                                        max_failing=max_failing, seed=seed, archive_dir=out_dir,
                                        source_ref=f"file:{archive}", log=log, time_budget_s=time_budget_s,
                                        max_baseline_s=min(120.0, time_budget_s / 3), workers=workers)
        result.tried, result.ops_tried, result.baseline_tests = stats.tried, stats.tried_ops, stats.baseline_tests
        result.proposed = len(tasks)
        for t in tasks:
            op = t["mutation"]["operator"]
            result.ops_proposed[op] = result.ops_proposed.get(op, 0) + 1
        if not tasks:
            result.why = (f"no mutation broke 1..{max_failing} of its {stats.baseline_tests} tests reproducibly "
                          f"(tried {stats.tried} of {stats.candidates}: no failing test {stats.no_failure}, "
                          f"too many {stats.too_many_failures}, flaky {stats.flaky}, timed out {stats.timed_out})")
        else:
            async with task_sandboxes(cfg, tasks[0], min(workers, len(tasks)), log=log) as sandboxes:
                cache = ValidationCache(out_dir / "validation.json")
                valid, rejected = await validate_tasks(tasks, sandboxes, cfg.backend, cache)
            for t in valid:
                op = t["mutation"]["operator"]
                result.ops_valid[op] = result.ops_valid.get(op, 0) + 1
            result.valid = len(valid)
            if valid:
                name, version = spec.split("==")
                save_tasks(valid, out_dir / f"{name}-{version}.jsonl.gz")
            else:
                result.why = f"every proposed task failed validation: {rejected[0][1][:200]}"
    except Exception as e:  # the package's problem: reported, the batch goes on
        result.why = diagnose(f"{type(e).__name__}: {e}" if not isinstance(e, (RuntimeError, ValueError)) else str(e))
    result.seconds = round(time.perf_counter() - start, 1)
    return result


async def synthesize_many(specs: list[str], cfg: Any, out_dir: Path, *, max_tasks: int = 30,
                          max_candidates: int = 150, seed: int = 0, log: Any = print,
                          time_budget_s: float = 600.0, workers: int = 1) -> list[PackageResult]:
    """Synthesise every package in turn; out_dir/report.json is rewritten after each one."""
    out_dir = out_dir.resolve()  # tasks point at their sdist by absolute path until shipped
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / "report.json"
    done: dict[str, dict[str, Any]] = json.loads(report_path.read_text()) if report_path.exists() else {}
    results = []
    for spec in specs:
        if spec in done and done[spec].get("valid"):
            log(f"== {spec}: done before ({done[spec]['valid']} valid); skipped")
            continue
        result = await synthesize_package(spec, cfg, out_dir, max_tasks=max_tasks, max_candidates=max_candidates,
                                          seed=seed, log=log, time_budget_s=time_budget_s, workers=workers)
        results.append(result)
        done[spec] = asdict(result)
        report_path.write_text(json.dumps(done, indent=1))
        log(f"== {result.package}: {result.valid} valid of {result.proposed} proposed in {result.seconds:.0f}s"
            + (f"; no task: {result.why}" if result.why else ""))
    return results


def ship(staging: Path, dest: Path = SUITE_DIR, test_every: int = 5) -> dict[str, int]:
    """Copy the validated tasks of `staging` into the shipped suite: each task's source points
    at its sdist under envs/swe/data/, and whole packages go to one split (test: about one
    package in `test_every`, chosen by a hash of the name; dev: the next one; else train)."""
    dest.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for f in sorted(staging.glob("*.jsonl.gz")):
        tasks = load_tasks(f)
        archive = Path(tasks[0]["source"].removeprefix("file:"))
        shutil.copy(archive, dest / archive.name)
        package = tasks[0]["environment_setup"]["package"].split("==")[0].lower()
        split = package_split(package, test_every)
        for t in tasks:
            t["source"] = f"data:{dest.relative_to(DATA_DIR).as_posix()}/{archive.name}"
            t["split"] = split
            t["difficulty"] = difficulty(t)
        save_tasks(tasks, dest / f.name)
        counts[split] = counts.get(split, 0) + len(tasks)
    return counts


def difficulty(task: dict[str, Any]) -> dict[str, Any]:
    """Figures to sort tasks by: lines and files the fix changes, tests it must turn green, the bug's kind."""
    changed = [ln for ln in task["patch"].splitlines()
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return {"lines_changed": len(changed), "files_changed": len(split_patch(task["patch"])),
            "failing_tests": len(task["FAIL_TO_PASS"]),
            "operator": (task.get("mutation") or {}).get("operator", "")}


def package_split(package: str, test_every: int = 5) -> str:
    h = int(hashlib.sha256(package.encode()).hexdigest(), 16) % test_every
    return "test" if h == 0 else "dev" if h == 1 else "train"


def _tail(text: str) -> str:
    return " | ".join(text.strip().splitlines()[-3:])[:400]
