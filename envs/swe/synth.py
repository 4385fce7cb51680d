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

import argparse
import asyncio
import configparser
import hashlib
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from agentrl.config import SandboxConfig

from .grade import AGENTRL_DIR, TestRun, is_test_file, parse_pytest_summary, prepare_repo
from .mutate import Mutation, find_mutations, sample_mutations, two_function_mutations
from .runtime import default_workers
from .schema import DATA_DIR, normalize_task, save_tasks

SPEC_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")
SKIP_DIRS = frozenset({"docs", "doc", "build", "dist", "examples", "benchmarks", "bench", "scripts",
                       "tools", "ci", ".github", ".git"})
SKIP_FILES = frozenset({"setup.py", "versioneer.py", "_version.py", "conftest.py", "noxfile.py", "__main__.py"})
TEST_EXTRAS = ("test", "tests", "testing", "dev")
TOX_FACTOR = re.compile(r"^[\w.{},!-]+:\s")
NOT_NEEDED = re.compile(r"^(pytest-cov|coverage|pytest-xdist|tox|flake8|black|mypy|ruff|pre-commit|sphinx)\b",
                        re.I)


def parse_spec(spec: str) -> tuple[str, str]:
    m = SPEC_RE.match(spec.strip())
    if not m:
        raise ValueError(f"package spec {spec!r} must look like NAME==VERSION (e.g. inflection==0.5.1)")
    return m.group(1), m.group(2)


def fetch_sdist(spec: str, dest: Path) -> Path:
    """The sdist of `NAME==VERSION` in `dest`, downloaded with pip on first use."""
    name, version = parse_spec(spec)
    dest.mkdir(parents=True, exist_ok=True)
    found = _find_sdist(dest, name, version)
    if found:
        return found
    # build isolation as pip does by default: setuptools_scm / flit / hatch / poetry backends are
    # fetched for the metadata step (without it pip reads a setuptools_scm version as 0.0.0)
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--disable-pip-version-check",
           "-q", "-d", str(dest), spec]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    found = _find_sdist(dest, name, version)
    if r.returncode != 0 or not found:
        raise RuntimeError(f"pip could not download the sdist of {spec}: {(r.stderr or r.stdout)[-600:]}")
    return found


def _find_sdist(folder: Path, name: str, version: str) -> Path | None:
    norm = re.sub(r"[-_.]+", "_", name).lower()
    for f in sorted(folder.iterdir()):
        stem = re.sub(r"[-_.]+", "_", f.name).lower()
        if stem.startswith(f"{norm}_{re.sub(r'[-_.]+', '_', version).lower()}_tar") or \
                stem == f"{norm}_{re.sub(r'[-_.]+', '_', version).lower()}_tar_gz":
            return f
    return None


def unpack(archive: Path, dest: Path) -> Path:
    """Unpack a source tarball into `dest` and return its single top folder."""
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise ValueError(f"{archive.name}: expected one top-level folder, found {[p.name for p in tops]}")
    return tops[0]


# ---------------------------------------------------------------------------------------------
# What is in the repository
# ---------------------------------------------------------------------------------------------


@dataclass
class Layout:
    source_files: list[str]
    test_files: list[str]
    pythonpath: list[str]
    test_requirements: list[str]


def analyse_repo(root: Path) -> Layout:
    """Source files (mutation targets), test files (pytest targets), import path and test deps."""
    sources, tests = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = PurePosixPath(rel).parts
        if any(p in SKIP_DIRS or p.endswith(".egg-info") or p.startswith(".") for p in parts[:-1]):
            continue
        if is_test_file(rel):
            if PurePosixPath(rel).name != "conftest.py" and PurePosixPath(rel).name != "__init__.py":
                tests.append(rel)
        elif parts[-1] not in SKIP_FILES and (len(parts) > 1 or not (root / "src").is_dir()):
            sources.append(rel)
    if not tests:
        raise ValueError(f"{root.name}: no test files (test_*.py, *_test.py, tests/) in the source archive")
    if not sources:
        raise ValueError(f"{root.name}: no Python source files besides the tests")
    pythonpath = ["src"] if (root / "src").is_dir() else []
    return Layout(sources, tests, pythonpath, test_requirements(root))


def test_requirements(root: Path) -> list[str]:
    """Test dependencies declared in pyproject.toml, setup.cfg, tox.ini or requirements files."""
    reqs: list[str] = []
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        try:
            import tomllib  # Python >= 3.11; older ones skip pyproject test extras

            data = tomllib.loads(pyproject.read_text())
        except (ImportError, ValueError):
            data = {}
        extras = data.get("project", {}).get("optional-dependencies", {})
        groups = data.get("dependency-groups", {})
        for key in TEST_EXTRAS:
            reqs += [r for r in extras.get(key, []) + groups.get(key, []) if isinstance(r, str)]
    cfg = configparser.ConfigParser(interpolation=None)
    for name in ("setup.cfg", "tox.ini"):
        if (root / name).exists():
            try:
                cfg.read(root / name)
            except configparser.Error:
                continue
    if cfg.has_section("options.extras_require"):
        for key in TEST_EXTRAS:
            reqs += cfg.get("options.extras_require", key, fallback="").split("\n")
    if cfg.has_section("testenv"):
        reqs += cfg.get("testenv", "deps", fallback="").split("\n")
    for f in sorted(root.glob("requirements*test*.txt")) + sorted(root.glob("requirements/test*.txt")):
        reqs += f.read_text().splitlines()
    out = []
    for r in reqs:
        r = r.split("#")[0].strip()
        if TOX_FACTOR.match(r):  # tox.ini "django22: Django>=2.2,<2.3": one env's pin, not pip syntax
            continue
        if r and not r.startswith(("-", "{", ".")) and not NOT_NEEDED.match(r) and r not in out:
            out.append(r)
    return out


# ---------------------------------------------------------------------------------------------
# Docker image
# ---------------------------------------------------------------------------------------------


def image_tag(spec: str) -> str:
    name, version = parse_spec(spec)
    return f"agentrl-swe-{re.sub(r'[^a-z0-9]+', '-', name.lower())}:{re.sub(r'[^A-Za-z0-9_.-]', '_', version)}"


HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def dockerfile(base_image: str, requirements: list[str], with_ca: bool) -> str:
    """pytest and the test requirements in the system Python's site-packages (sandboxes run
    `python3` from the default PATH), installed with a throwaway venv's pip. The host's CA bundle is
    used for the build only (machines behind a TLS-intercepting proxy) and not left in the image."""
    reqs = " ".join(f"'{r}'" for r in ["pytest", *requirements])
    # PIP_CERT as well as --cert: pip's build-isolation subprocess (an sdist-only requirement's
    # setuptools) reads the environment, not the parent's command line
    cert = "--cert /tmp/host-ca.crt " if with_ca else ""
    env = "PIP_CERT=/tmp/host-ca.crt " if with_ca else ""
    site = "$(python3 -c 'import site; print(site.getsitepackages()[0])')"
    return (f"FROM {base_image}\n"
            + ("COPY host-ca.crt /tmp/host-ca.crt\n" if with_ca else "")
            + f"RUN python3 -m venv /tmp/pipenv && {env}/tmp/pipenv/bin/pip install {cert}--no-cache-dir "
            f"--disable-pip-version-check --target \"{site}\" {reqs} && rm -rf /tmp/pipenv /tmp/host-ca.crt\n"
            "WORKDIR /work\n")


def build_image(spec: str, layout: Layout, base_image: str, *, rebuild: bool = False,
                requirements: list[str] | None = None) -> str:
    """Build (once) the package's sandbox image: the base image plus pytest and its test deps
    (`requirements`: the exact pins of the package's local task runtime, so both backends run the
    same versions; else the declared test requirements). Builds use the host network; the
    sandboxes themselves run with `--network none`."""
    tag = image_tag(spec)
    if shutil.which("docker") is None:
        raise RuntimeError("the docker CLI is not installed; use sandbox.backend=local or install docker.io")
    if not rebuild and subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory() as ctx:
        with_ca = HOST_CA.exists()
        if with_ca:
            shutil.copy(HOST_CA, Path(ctx, "host-ca.crt"))
        reqs = layout.test_requirements if requirements is None else [r for r in requirements if r != "pytest"]
        Path(ctx, "Dockerfile").write_text(dockerfile(base_image, reqs, with_ca))
        r = subprocess.run(["docker", "build", "--network", "host", "-t", tag, ctx],
                           capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        raise RuntimeError(f"docker build of {tag} failed: {(r.stderr or r.stdout)[-1500:]}")
    return tag


def ensure_task_image(task: dict[str, Any], base_image: str) -> str:
    """The task's docker image, built from its shipped source archive if this engine lacks it."""
    image = task.get("image") or base_image
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0:
        return image
    spec = task.get("environment_setup", {}).get("package")
    if not spec or image != image_tag(spec):
        raise RuntimeError(f"task {task['instance_id']}: docker image {image} is missing and agentrl does not "
                           "know how to build it (no environment_setup.package)")
    from .schema import resolve_source

    archive = resolve_source(task)
    if archive is None:
        raise RuntimeError(f"task {task['instance_id']}: image {image} is missing and the task has no source")
    with tempfile.TemporaryDirectory() as tmp:
        layout = analyse_repo(unpack(archive, Path(tmp)))
    from .runtime import frozen_requirements, task_runtime

    return build_image(spec, layout, base_image, requirements=frozen_requirements(task_runtime(task)))


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
    from .runtime import on_each, task_sandboxes

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
        from .runtime import RuntimeSpec, ensure_runtime, frozen_requirements

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


# ---------------------------------------------------------------------------------------------
# CLI: agentrl swe synth | agentrl swe validate
# ---------------------------------------------------------------------------------------------


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
            from .commands import build_cli, stats_cli

            return build_cli(args) if args.cmd == "build" else stats_cli(args)
        if args.cmd == "synth":
            return asyncio.run(_synth_cli(args))
        return asyncio.run(_validate_cli(args))
    except (ValueError, RuntimeError) as e:
        from .batch import diagnose

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
    from .grade import ValidationCache, validate_tasks
    from .runtime import spec_of, task_sandboxes
    from .schema import resolve_tasks

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
    from .batch import synthesize_many

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
