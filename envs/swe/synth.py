"""Offline SWE task synthesis from real packages by bug injection (issue 8).

    agentrl swe synth --package inflection==0.5.1 --max-tasks 8 --out tasks.jsonl

1. download the package's sdist (`pip download --no-binary :all: --no-deps`) and unpack it;
2. find its source files and test files; on the docker backend, build its sandbox image from the
   base image (`docker build --network host`, pytest + the package's test requirements);
3. run the test files twice in a sandbox: the tests that pass both times are the baseline;
4. for each sampled AST mutation of the source (mutate.py): run the tests; keep the bug if
   between 1 and `max_failing` baseline tests fail (and the run did not time out), run again and
   keep only tests whose outcome repeats (flaky ones are dropped);
5. write the task: FAIL_TO_PASS = the tests the bug breaks, PASS_TO_PASS = the other baseline
   tests of the same test files, gold patch = the reverse diff of the mutation, problem statement
   = the failing test names and their assertion messages (checked to quote no line of the patch).
"""


from __future__ import annotations

import asyncio
import hashlib
import re
import shlex
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from agentrl.config import SandboxConfig

from .grade import AGENTRL_DIR, TestRun, parse_pytest_summary, prepare_repo
from .images import build_image, image_tag
from .mutate import Mutation, find_mutations, sample_mutations, two_function_mutations
from .runtime import RuntimeSpec, ensure_runtime, frozen_requirements, on_each, task_sandboxes
from .schema import normalize_task
from .source import analyse_repo, fetch_sdist, parse_spec, unpack

# ---------------------------------------------------------------------------------------------
# Problem statements
# ---------------------------------------------------------------------------------------------


def problem_statement(package: str, failing: list[str], messages: dict[str, str], patch: str,
                      show: int = 5, style: str = "tests") -> str:
    """Describe the bug by its symptoms. `tests`: the failing test ids and their assertion
    messages; `report`: a user's bug report, the failing behaviour in words (from the test names)
    and what went wrong, with no test id. A message that quotes a line of the patch is left out,
    so the statement never leaks the fix."""
    patch_lines = {ln[1:].strip() for ln in patch.splitlines()
                   if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and len(ln[1:].strip()) >= 6}
    if style == "report":
        return _bug_report(package, failing, messages, patch_lines, show)
    lines = [f"After a recent change, {len(failing)} test(s) of the `{package}` package fail:", ""]
    for node in failing[:show]:
        msg = " ".join(messages.get(node, "").split())[:300]
        if msg and not any(pl in msg for pl in patch_lines):
            lines.append(f"- `{node}`: {msg}")
        else:
            lines.append(f"- `{node}`")
    if len(failing) > show:
        lines.append(f"- ... and {len(failing) - show} more")
    lines += ["", "The tests are correct; the bug is in the library code. Find it and fix it so that these "
              "tests pass without breaking the other tests. Do not modify the tests."]
    return "\n".join(lines)


def _bug_report(package: str, failing: list[str], messages: dict[str, str], patch_lines: set[str],
                show: int) -> str:
    behaviours = list(dict.fromkeys(_behaviour(n) for n in failing))
    title = behaviours[0] + (f" (and {len(behaviours) - 1} more)" if len(behaviours) > 1 else "")
    lines = [f"{package}: {title} is broken", "",
             f"After updating `{package}`, code that relied on the following behaviour stopped working:", ""]
    for node in failing[:show]:
        msg = " ".join(messages.get(node, "").split())[:300]
        leak = not msg or any(pl in msg for pl in patch_lines)
        lines.append(f"- {_behaviour(node)}" + ("" if leak else f": {msg}"))
    if len(failing) > show:
        lines.append(f"- ... and {len(failing) - show} more cases")
    lines += ["", "This used to work and the package's own test suite expects it to. Please fix the library code "
              "(not its tests)."]
    return "\n".join(lines)


def _behaviour(node: str) -> str:
    """A test id in words: `tests/test_x.py::TestTitle::test_camel_case[a-b]` -> `Title: camel case (a-b)`."""
    parts = node.split("::")
    name, _, params = parts[-1].partition("[")
    words = re.sub(r"^test_?", "", name).replace("_", " ").strip() or name
    owner = re.sub(r"^Test_?", "", parts[-2]) if len(parts) > 2 else ""
    return (f"{owner}: " if owner else "") + words + (f" ({params.rstrip(']')})" if params else "")


# ---------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------


@dataclass
class SynthStats:
    candidates: int = 0
    tried: int = 0
    kept: int = 0
    no_failure: int = 0
    too_many_failures: int = 0
    flaky: int = 0
    timed_out: int = 0
    baseline_tests: int = 0
    seconds: float = 0.0
    tried_ops: dict[str, int] = field(default_factory=dict)  # mutations tried per operator


async def synthesize(spec: str, sandbox_cfg: SandboxConfig, *, max_tasks: int = 8, max_candidates: int = 200,
                     max_failing: int = 10, seed: int = 0, archive_dir: Path | None = None,
                     source_ref: str | None = None, log: Any = print,
                     time_budget_s: float = float("inf"),
                     max_baseline_s: float = 600.0, workers: int = 1) -> tuple[list[dict[str, Any]], SynthStats]:
    """Synthesise up to `max_tasks` bug-fix tasks from one package (each bug breaks 1..max_failing
    baseline tests, reproducibly; `validate_task` re-checks them from scratch). Mutations are
    tried on `workers` sandboxes at once, each with its own copy of the package; the tasks kept
    are the first `max_tasks` in the sampled order, whichever sandbox found them."""
    start = time.perf_counter()
    name, version = parse_spec(spec)
    archive = fetch_sdist(spec, archive_dir or Path("~/.cache/agentrl/swe/sdists").expanduser())
    with tempfile.TemporaryDirectory() as tmp:
        root = unpack(archive, Path(tmp))
        layout = analyse_repo(root)
        sources = {f: (root / f).read_text(encoding="utf-8", errors="replace") for f in layout.source_files}
    log(f"{spec}: {len(layout.source_files)} source files, {len(layout.test_files)} test files, "
        f"test requirements {layout.test_requirements or 'none'}")
    image = image_tag(spec)  # the task's docker image; the local backend ignores it
    if sandbox_cfg.backend == "docker":
        runtime = ensure_runtime(RuntimeSpec(spec, str(archive), tuple(layout.pythonpath)), log=log)
        build_image(spec, layout, sandbox_cfg.image, requirements=frozen_requirements(runtime))
        log(f"{spec}: sandbox image {image}")
    base = {
        "instance_id": f"{name}-{version}", "repo": name, "base_commit": "", "image": image,
        "source": f"file:{archive}", "test_patch": "", "problem_statement": "-", "patch": "-",
        "FAIL_TO_PASS": ["-"], "PASS_TO_PASS": [],
        "environment_setup": {"package": spec, "pythonpath": layout.pythonpath},
    }
    base = normalize_task(base)
    stats = SynthStats()
    kept: list[tuple[int, dict[str, Any]]] = []  # (index in the sampled order, task)
    # local: the package's runtime venv, mounted; docker: the package's image
    async with task_sandboxes(sandbox_cfg, base, workers, log=log) as sandboxes:
        await asyncio.gather(*(prepare_repo(s, base, commit=False) for s in sandboxes))
        targets = layout.test_files
        def baseline(i: int) -> Awaitable[TestRun]:  # twice: a test must pass both times
            return _run_tests(sandboxes[i % len(sandboxes)], base, targets, timeout=max_baseline_s)

        runs = (await asyncio.gather(baseline(0), baseline(1)) if len(sandboxes) > 1  # one sandbox runs one at a time
                else [await baseline(0), await baseline(1)])
        if any(r.timed_out for r in runs):
            raise RuntimeError(f"{spec}: its tests take longer than {max_baseline_s:.0f} s per run (the limit for "
                               "synthesis, which runs them several times per task)")
        stable = sorted(n for n in runs[0].statuses if runs[0].passed(n) and runs[1].passed(n))
        stats.baseline_tests = len(stable)
        if not stable:
            raise RuntimeError(f"{spec}: no test passes on the unmodified package:\n{runs[0].output[-1500:]}")
        baseline_s = max(r.seconds for r in runs)
        log(f"{spec}: {len(stable)} stable passing tests at baseline ({baseline_s:.1f}s per run)")
        mutations = [m for f, src in sources.items() for m in _safe_mutations(src, f)]
        mutations += two_function_mutations(mutations, k=max(10, len(mutations) // 10), seed=seed)
        stats.candidates = len(mutations)
        candidates = enumerate(sample_mutations(mutations, max_candidates, seed))  # shared by the workers

        async def work(sandbox: Any) -> None:
            for index, m in candidates:
                if len(kept) >= max_tasks or time.perf_counter() - start > time_budget_s:
                    return
                stats.tried += 1
                stats.tried_ops[m.operator] = stats.tried_ops.get(m.operator, 0) + 1
                task = await _try_mutation(sandbox, base, m, targets, stable, max_failing,
                                           timeout=max(30.0, 5 * baseline_s), stats=stats)
                if task is not None:
                    task["source"] = source_ref or f"file:{archive}"
                    kept.append((index, normalize_task(task)))
                    log(f"{spec}: kept {task['instance_id']} ({m.operator} at {m.path}:{m.lineno}, "
                        f"{len(task['FAIL_TO_PASS'])} failing)")

        await on_each(sandboxes, work)
    tasks = [t for _, t in sorted(kept, key=lambda pair: pair[0])][:max_tasks]
    stats.kept = len(tasks)
    stats.seconds = time.perf_counter() - start
    return tasks, stats


async def _run_tests(sandbox: Any, task: dict[str, Any], targets: list[str], timeout: float) -> TestRun:
    """pytest's own `-rA` summary, without the grader's tamper-checking plugin: synthesis runs the
    unmodified package and its mutants (no agent code), and its checks after every test cost up to
    10x here. Every kept task is then validated through the real grader (grade.validate_task)."""
    paths = ":".join(f"$PWD/{p}" for p in [f"{AGENTRL_DIR}/site", *task["environment_setup"].get("pythonpath", [])])
    cmd = (f'PYTHONPATH="{paths}${{PYTHONPATH:+:$PYTHONPATH}}" PYTHONDONTWRITEBYTECODE=1 COLUMNS=400 python3 -m pytest '
           "-p no:cacheprovider -o addopts= -rA --tb=short --color=no -q --continue-on-collection-errors "
           + " ".join(shlex.quote(t) for t in targets))
    r = await sandbox.exec(cmd, timeout=timeout)
    if r.truncated:
        raise RuntimeError(f"{task['instance_id']}: pytest output was truncated; raise sandbox.max_output_bytes")
    statuses, messages = parse_pytest_summary(r.stdout)
    return TestRun(statuses, messages, r.stdout + r.stderr, r.exit_code, r.timed_out, r.seconds)


def related_tests(source_path: str, test_files: list[str]) -> list[str]:
    """The test files named after the mutated module (`toolz/itertoolz.py` -> `test_itertoolz.py`),
    else all: a mutant is checked against its module's tests first, which is several times
    faster on packages with many test files (its FAIL_TO_PASS / PASS_TO_PASS come from those)."""
    p = PurePosixPath(source_path)
    stem = (p.parent.name if p.stem == "__init__" else p.stem).lstrip("_").lower()
    related = [t for t in test_files if stem and stem in PurePosixPath(t).stem.lower()]
    return related or test_files


def _safe_mutations(source: str, path: str) -> list[Mutation]:
    try:
        return find_mutations(source, path)
    except ValueError:  # a file that does not parse on this Python (e.g. py2-only): skip it
        return []


async def _try_mutation(sandbox: Any, base: dict[str, Any], m: Mutation, targets: list[str],
                        stable: list[str], max_failing: int, timeout: float,
                        stats: SynthStats) -> dict[str, Any] | None:
    targets = related_tests(m.path, targets)
    stable = [n for n in stable if n.split("::")[0] in targets]
    await sandbox.write_file(m.path, m.mutated)
    try:
        first = await _run_tests(sandbox, base, targets, timeout=timeout)
        if first.timed_out:
            stats.timed_out += 1
            return None
        failing = [n for n in stable if not first.passed(n)]
        if not failing:
            stats.no_failure += 1
            return None
        if len(failing) > max_failing:
            stats.too_many_failures += 1
            return None
        second = await _run_tests(sandbox, base, targets, timeout=timeout)
    finally:
        await sandbox.write_file(m.path, m.original)
    flaky = {n for n in stable if first.passed(n) != second.passed(n)}
    f2p = [n for n in failing if n not in flaky]
    if second.timed_out or not f2p:
        stats.flaky += 1
        return None
    files = {n.split("::")[0] for n in f2p}
    p2p = [n for n in stable if n not in flaky and n not in f2p and n.split("::")[0] in files]
    gold = m.gold_patch
    digest = hashlib.sha256(m.bug_patch.encode()).hexdigest()[:8]
    package = base["environment_setup"]["package"]
    return {
        **base,
        "instance_id": f"{base['instance_id']}-{digest}",
        "problem_statement": problem_statement(package.split("==")[0], f2p, first.messages, gold, style="report"),
        "patch": gold,
        "bug_patch": m.bug_patch,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "mutation": {"operator": m.operator, "path": m.path, "lineno": m.lineno, "description": m.description},
    }
