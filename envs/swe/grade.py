"""Grading SWE patches in a fresh sandbox, and validating tasks (gold patch 1, empty patch 0).

Everything here speaks only the Sandbox protocol (architecture.md §5), so it runs the same on the local
(bubblewrap) and docker backends. The repository lives at the sandbox work dir; agentrl's own
files (the source archive, the pytest libraries for images without pytest, the patch) go under
`.agentrl/`, which git ignores.

Grading a submitted diff (issue 8):
1. drop every part of the diff that touches a protected file: tests, conftest.py, pytest/tox
   configuration, *.pth, sitecustomize (no reward for editing tests);
2. rebuild the task's repository in a freshly reset sandbox, apply what is left, then the
   task's `test_patch`;
3. run the test files of FAIL_TO_PASS + PASS_TO_PASS; the patch passes iff every one of those
   tests passes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
import shlex
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from agentrl.sandboxes.base import Sandbox

from .runtime import on_each, provide_runtime, runtime_fingerprint
from .schema import resolve_source
from .source import is_test_file

AGENTRL_DIR = ".agentrl"  # agentrl's files inside the work dir; listed in .git/info/exclude
GIT = "git -c user.name=agentrl -c user.email=agentrl@localhost -c core.fileMode=false"
PROTECTED_NAMES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml",
                             "tox.ini", "setup.cfg", "pyproject.toml",
                             "sitecustomize.py", "usercustomize.py", "noxfile.py"})
# Never part of the agent's diff: agentrl's files, and what running tools leaves in HOME (= work dir).
GIT_EXCLUDE = (f"/{AGENTRL_DIR}/", "/.local/", "/.cache/", "/.config/", "/.*_history", "__pycache__/", "*.pyc",
               ".pytest_cache/")
Outcome = Literal["no_submit", "empty", "fail", "pass"]
_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S.*?)(?: - (.*))?$")


# ---------------------------------------------------------------------------------------------
# Which files are tests, and filtering a diff
# ---------------------------------------------------------------------------------------------


# Names that would shadow the test framework or the grading plugin on sys.path, and package
# metadata that makes pytest load a plugin (entry points): never part of an agent's patch.
SHADOW_NAMES = frozenset({"pytest", "_pytest", "pluggy", "iniconfig", "py", "agentrl_grade_plugin"})
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")


def is_protected(path: str, task: dict[str, Any] | None = None) -> bool:
    """A file the agent's patch may not change: tests, test configuration, import hooks, and
    anything that shadows the test framework or registers a pytest plugin."""
    setup = (task or {}).get("environment_setup", {})
    p = PurePosixPath(path)
    tops = [path.split("/")[0]] + [path[len(r) + 1:].split("/")[0] for r in setup.get("pythonpath", ())
                                   if path.startswith(str(r).rstrip("/") + "/")]  # names importable from sys.path
    shadows = (any(t.removesuffix(".py") in SHADOW_NAMES for t in tops)
               or any(part.endswith(METADATA_SUFFIXES) for part in p.parts))
    return (shadows or is_test_file(path) or p.name in PROTECTED_NAMES or p.suffix == ".pth"
            or path.startswith(AGENTRL_DIR + "/") or path.startswith(".git/")
            or path in setup.get("test_files", ()) or path in setup.get("protected", ()))


def split_patch(patch: str) -> list[tuple[str, str]]:
    """Split a unified diff into (path, text) per file; path is the new name (old if deleted)."""
    starts = [m.start() for m in re.finditer(r"^diff --git ", patch, re.M)]
    if not starts:  # plain `diff -u` output: one section per '--- ' header
        starts = [m.start() for m in re.finditer(r"^--- ", patch, re.M)]
    sections = [patch[a:b] for a, b in zip(starts, [*starts[1:], len(patch)])]
    out = []
    for text in sections:
        path = _section_path(text)
        if path is None:
            raise ValueError(f"cannot find the file name in diff section: {text[:120]!r}")
        out.append((path, text))
    return out


def hunk_texts(section: str) -> tuple[list[str], list[str]]:
    """(old, new) text of each hunk of one file's diff, context lines included."""
    olds, news = [], []
    old: list[str] | None = None
    new: list[str] = []
    for line in section.splitlines():
        if line.startswith("@@"):
            if old is not None:
                olds.append("\n".join(old))
                news.append("\n".join(new))
            old, new = [], []
        elif old is not None and line[:1] in (" ", "-", "+") and not line.startswith(("---", "+++")):
            if line[0] in " -":
                old.append(line[1:])
            if line[0] in " +":
                new.append(line[1:])
    if old is not None:
        olds.append("\n".join(old))
        news.append("\n".join(new))
    return olds, news


def _section_path(text: str) -> str | None:
    new = re.search(r"^\+\+\+ (\S+)", text, re.M)
    old = re.search(r"^--- (\S+)", text, re.M)
    for m in (new, old):
        if m and m.group(1) != "/dev/null":
            return _strip_prefix(m.group(1))
    m = re.match(r"diff --git a/(\S+) b/(\S+)", text)  # mode-only or binary change
    return m.group(2) if m else None


def _strip_prefix(name: str) -> str:
    return name[2:] if name[:2] in ("a/", "b/") else name


def filter_patch(patch: str, task: dict[str, Any] | None = None) -> tuple[str, list[str]]:
    """The patch without its protected files, and the protected paths it tried to change."""
    kept, dropped = [], []
    for path, text in split_patch(patch):
        (dropped if is_protected(path, task) else kept).append((path, text))
    return "".join(t for _, t in kept), [p for p, _ in dropped]


# ---------------------------------------------------------------------------------------------
# Preparing the repository and running pytest in a sandbox
# ---------------------------------------------------------------------------------------------


async def _sh(sandbox: Sandbox, cmd: str, timeout: float = 60.0, what: str = "") -> str:
    r = await sandbox.exec(cmd, timeout=timeout)
    if not r.ok:
        raise RuntimeError(f"{what or cmd} failed (exit {r.exit_code}{', timed out' if r.timed_out else ''}): "
                           f"{(r.stderr or r.stdout)[-800:]}")
    return r.stdout


async def prepare_repo(sandbox: Sandbox, task: dict[str, Any], *, commit: bool = True) -> None:
    """Put the task's buggy repository at the sandbox work dir, committed as git's base.

    The source archive is unpacked (top folder stripped), the task's `bug_patch` applied (for
    synthesised tasks) and, if `commit`, everything committed so `git diff` shows the agent's
    changes only. pytest and the package's dependencies come from the task runtime (runtime.py).
    """
    archive = await asyncio.to_thread(resolve_source, task)  # may download an sdist
    await _sh(sandbox, f"mkdir -p {AGENTRL_DIR}")  # made inside, so the sandbox user owns it
    if archive is not None:
        if not archive.name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")):
            raise ValueError(f"task {task['id']}: source archive {archive.name} is not a tarball")
        await sandbox.upload(str(archive), f"{AGENTRL_DIR}/{archive.name}")
        await _sh(sandbox, f"tar -xf {AGENTRL_DIR}/{shlex.quote(archive.name)} --strip-components=1 "
                           f"&& rm {AGENTRL_DIR}/{shlex.quote(archive.name)}", what="unpacking the source")
    repo_dir = task["environment_setup"].get("repo_dir")
    if archive is None and repo_dir:
        await _sh(sandbox, f"cp -a {shlex.quote(repo_dir)}/. .", what=f"copying the repo from {repo_dir}")
    if task.get("bug_patch"):
        await _apply(sandbox, task["bug_patch"], "bug")
    await provide_runtime(sandbox, task, f"{AGENTRL_DIR}/site")  # the task runtime, never agentrl's venv
    await _sh(sandbox, _USER_SITE.format(pth=" ".join(f'"$PWD/{p}"' for p in
                                                      task["environment_setup"].get("pythonpath", []))),
              what="installing pytest in the user site")
    if commit:
        exclude = "\\n".join(GIT_EXCLUDE)
        await _sh(sandbox, f"{GIT} init -q . && mkdir -p .git/info && printf '{exclude}\\n' >> .git/info/exclude "
                           f"&& {GIT} add -A && {GIT} commit -qm base --no-verify", what="git init")


# So the agent's own `python3 -m pytest` works too: an uploaded runtime and the repo's import
# path go into Python's user site, when the sandbox's Python has one (HOME is the work dir on
# the local backend; docker images get PYTHONPATH at build time instead).
_USER_SITE = (
    "us=$(python3 -c 'import site; print(site.getusersitepackages() if site.ENABLE_USER_SITE else \"\")'); "
    "if [ -n \"$us\" ] && mkdir -p \"$us\" 2>/dev/null; then "
    f"site=; if [ -d {AGENTRL_DIR}/site ]; then site=\"$PWD/{AGENTRL_DIR}/site\"; fi; "
    "printf '%s\\n' $site {pth} > \"$us/agentrl-repo.pth\"; fi"
)


async def _apply(sandbox: Sandbox, patch: str, name: str) -> tuple[bool, str]:
    """Apply a unified diff with `git apply`, falling back to `patch -p1` (fuzzier)."""
    path = f"{AGENTRL_DIR}/{name}.diff"
    await sandbox.write_file(path, patch if patch.endswith("\n") else patch + "\n")
    r = await sandbox.exec(f"git apply --whitespace=nowarn {path} || patch -p1 --batch --forward < {path}",
                           timeout=60)
    return r.ok, (r.stderr or r.stdout)[-800:]


@dataclass
class TestRun:
    """Per-test statuses of one pytest run (node id → PASSED/FAILED/ERROR/XFAIL/XPASS)."""

    statuses: dict[str, str]
    messages: dict[str, str]
    output: str
    exit_code: int
    timed_out: bool
    seconds: float

    def passed(self, node_id: str) -> bool:
        return self.statuses.get(node_id) == "PASSED"


def parse_pytest_summary(output: str) -> tuple[dict[str, str], dict[str, str]]:
    """Parse the `-rA` short summary: statuses and one-line failure messages per node id."""
    statuses: dict[str, str] = {}
    messages: dict[str, str] = {}
    in_summary = False
    for line in output.splitlines():
        if "short test summary info" in line:
            in_summary = True
            continue
        if not in_summary:
            continue
        if line.startswith("PASSED "):  # no message: the rest is the node id, spaces included
            statuses[line[7:]] = "PASSED"
            continue
        m = _SUMMARY.match(line)
        if m:
            status, node, msg = m.groups()
            statuses[node] = status
            if msg:
                messages[node] = msg
    return statuses, messages


PLUGIN_DIR = f"{AGENTRL_DIR}/plugin"
PLUGIN_SOURCE = (Path(__file__).with_name("grade_plugin.py")).read_text()
_RESULTS = "AGENTRL-RESULTS "


def pytest_command(task: dict[str, Any], targets: list[str]) -> str:
    """The shell command that runs pytest on `targets` at the work dir, reporting every test
    through agentrl's grading plugin (grade_plugin.py; it reads a nonce on stdin)."""
    setup = task.get("environment_setup", {})
    paths = ":".join(f"$PWD/{p}" for p in [PLUGIN_DIR, f"{AGENTRL_DIR}/site", *setup.get("pythonpath", [])])
    base = setup.get("test_cmd") or ("python3 -m pytest -p no:cacheprovider -o addopts= -rA --tb=short "
                                     "--color=no -q --continue-on-collection-errors")
    return (f'PYTHONPATH="{paths}${{PYTHONPATH:+:$PYTHONPATH}}" PYTHONDONTWRITEBYTECODE=1 COLUMNS=400 '
            f"{base} -p agentrl_grade_plugin {' '.join(shlex.quote(t) for t in targets)}")


def plugin_results(stdout: str, nonce: str) -> tuple[dict[str, str] | None, str]:
    """The plugin's statuses from its one nonce-stamped line, or (None, why) when the run did not
    produce exactly one such line or the plugin saw tampering."""
    lines = [ln for ln in stdout.splitlines() if nonce in ln]
    if len(lines) != 1 or not lines[0].startswith(f"{_RESULTS}{nonce} "):
        return None, ("the test run ended before the grader's report (early exit?)" if not lines
                      else "the grader's report was forged or repeated")
    try:
        report = json.loads(lines[0][len(_RESULTS) + len(nonce) + 1:])
        statuses = {str(k): str(v) for k, v in report["results"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, "the grader's report is unreadable"
    if report.get("tampered"):
        return None, "tampering with the test run: " + "; ".join(map(str, report["tampered"][:5]))
    return statuses, ""


async def run_tests(sandbox: Sandbox, task: dict[str, Any], targets: list[str],
                    timeout: float | None = None) -> TestRun:
    """Run pytest in the sandbox; a timeout or truncated output is reported, never hidden. The
    statuses come from agentrl's plugin, never from text the tested code could print."""
    timeout = timeout or float(task.get("environment_setup", {}).get("timeout_s", 120.0))
    await sandbox.write_file(f"{PLUGIN_DIR}/agentrl_grade_plugin.py", PLUGIN_SOURCE)
    nonce = secrets.token_hex(16)
    r = await sandbox.exec(pytest_command(task, targets), timeout=timeout, stdin=nonce + "\n")
    output = r.stdout + r.stderr
    _, messages = parse_pytest_summary(r.stdout)
    statuses, why = plugin_results(r.stdout, nonce)
    if r.truncated:
        raise RuntimeError(f"task {task.get('id')}: pytest output was truncated; raise sandbox.max_output_bytes")
    if statuses is None:
        statuses, output = {}, f"[agentrl grader: {why}]\n{output}"
    return TestRun(statuses, messages, output, r.exit_code, r.timed_out, r.seconds)


def test_files(task: dict[str, Any]) -> list[str]:
    """The test files that hold the task's FAIL_TO_PASS and PASS_TO_PASS tests."""
    return sorted({n.split("::")[0] for n in task["FAIL_TO_PASS"] + task.get("PASS_TO_PASS", [])})


# ---------------------------------------------------------------------------------------------
# Grading and validation
# ---------------------------------------------------------------------------------------------


@dataclass
class Evaluation:
    """What a patch did to the task's tests."""

    resolved: bool
    applied: bool
    failed: list[str] = field(default_factory=list)  # required tests that did not pass
    dropped: list[str] = field(default_factory=list)  # protected files the patch tried to change
    reason: str = ""
    seconds: float = 0.0


async def evaluate_patch(sandbox: Sandbox, task: dict[str, Any], patch: str,
                         timeout: float | None = None) -> Evaluation:
    """Reset the sandbox, rebuild the repo, apply `patch` minus protected files, run the tests."""
    start = time.perf_counter()
    kept, dropped = filter_patch(patch, task)
    await sandbox.reset()
    await prepare_repo(sandbox, task, commit=False)
    if kept.strip():
        ok, err = await _apply(sandbox, kept, "submission")
        if not ok:
            return Evaluation(False, False, dropped=dropped, reason=f"patch does not apply: {err}",
                              seconds=time.perf_counter() - start)
    if task.get("test_patch"):
        ok, err = await _apply(sandbox, task["test_patch"], "test_patch")
        if not ok:
            raise RuntimeError(f"task {task['id']}: its test_patch does not apply: {err}")
    run = await run_tests(sandbox, task, test_files(task), timeout)
    required = task["FAIL_TO_PASS"] + task.get("PASS_TO_PASS", [])
    failed = [n for n in required if not run.passed(n)]
    reason = "timed out" if run.timed_out else (f"{len(failed)} required test(s) failed" if failed else "")
    return Evaluation(not failed and not run.timed_out, True, failed, dropped, reason,
                      time.perf_counter() - start)


@dataclass
class Grade:
    outcome: Outcome
    evaluation: Evaluation | None = None


async def grade(sandbox: Sandbox, task: dict[str, Any], patch: str | None,
                timeout: float | None = None) -> Grade:
    """The outcome level of a submission (algorithms.md §3.2): no submit < empty < fail < pass.
    `patch` None means the agent never submitted. A patch that only touches protected files is
    empty."""
    if patch is None:
        return Grade("no_submit")
    if not filter_patch(patch, task)[0].strip():
        return Grade("empty")
    ev = await evaluate_patch(sandbox, task, patch, timeout)
    return Grade("pass" if ev.resolved else "fail", ev)


@dataclass
class Validation:
    ok: bool
    reason: str = ""
    seconds: float = 0.0
    cached: bool = False
    error: bool = False  # the check itself crashed (engine down, missing archive): not cached


async def validate_task(task: dict[str, Any], sandbox: Sandbox) -> Validation:
    """A task is valid iff its gold patch resolves it and, without a patch, every FAIL_TO_PASS
    test fails while every PASS_TO_PASS test passes."""
    start = time.perf_counter()
    try:
        gold = await evaluate_patch(sandbox, task, task["patch"])
        if gold.dropped:
            return Validation(False, f"gold patch touches protected files {gold.dropped}")
        if not gold.resolved:
            return Validation(False, f"gold patch does not resolve the task: {gold.reason}; "
                                     f"failing: {gold.failed[:5]}")
        base = await evaluate_patch(sandbox, task, "")
        f2p_passing = [n for n in task["FAIL_TO_PASS"] if n not in base.failed]
        p2p_failing = [n for n in task.get("PASS_TO_PASS", []) if n in base.failed]
        if f2p_passing:
            return Validation(False, f"FAIL_TO_PASS tests pass without any patch: {f2p_passing[:5]}")
        if p2p_failing:
            return Validation(False, f"PASS_TO_PASS tests fail without any patch: {p2p_failing[:5]}")
    except Exception as e:  # a broken archive, test_patch or image rejects the task, not the run
        return Validation(False, f"{type(e).__name__}: {e}", time.perf_counter() - start, error=True)
    return Validation(True, "", time.perf_counter() - start)


def task_key(task: dict[str, Any], backend: str) -> str:
    """Cache key: the task's content, the backend that validated it and the build of the task's
    local runtime (a rebuilt runtime, e.g. one that lost pytest, must not hide behind old results)."""
    blob = json.dumps({k: v for k, v in task.items() if k != "id"}, sort_keys=True, default=str)
    return hashlib.sha256(f"{backend}\0{runtime_fingerprint(task)}\0{blob}".encode()).hexdigest()[:32]


class ValidationCache:
    """Validation results on disk, so training start-up does not re-run every task's tests."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path or "~/.cache/agentrl/swe/validation.json").expanduser()
        try:
            self.data: dict[str, dict[str, Any]] = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            self.data = {}

    def get(self, key: str) -> Validation | None:
        entry = self.data.get(key)
        return Validation(**{**entry, "cached": True}) if entry else None

    def put(self, key: str, result: Validation) -> None:
        self.data[key] = {**asdict(result), "cached": False}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{time.monotonic_ns()}")
        tmp.write_text(json.dumps(self.data, indent=0))
        tmp.replace(self.path)


async def validate_tasks(tasks: list[dict[str, Any]], sandboxes: Sequence[Sandbox], backend: str,
                         cache: ValidationCache | None = None, log: Any = None,
                         ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Validate every task (cached per task content, backend and runtime build), one task at a time
    on each of `sandboxes` (validation is one pytest process at a time: a sandbox per core keeps
    every core busy); returns (valid, rejected) in the tasks' order, rejected holding
    (instance_id, reason)."""
    cache = cache if cache is not None else ValidationCache()
    results: list[Validation | None] = [None] * len(tasks)
    pending = iter(range(len(tasks)))  # shared: each task goes to the first free sandbox

    async def work(sandbox: Sandbox) -> None:
        for i in pending:
            task = tasks[i]
            result = cache.get(task_key(task, backend))
            if result is None:
                result = await validate_task(task, sandbox)
                if not result.error:  # keyed after the run: validation may have built the runtime
                    cache.put(task_key(task, backend), result)
            if log is not None:
                log(f"{task['instance_id']}: {'ok' if result.ok else 'REJECTED: ' + result.reason}"
                    f"{' (cached)' if result.cached else f' ({result.seconds:.1f}s)'}")
            results[i] = result

    if not sandboxes:
        raise ValueError("validate_tasks needs at least one sandbox")
    await on_each(list(sandboxes), work)
    valid = [t for t, r in zip(tasks, results) if r is not None and r.ok]
    rejected = [(t["instance_id"], r.reason) for t, r in zip(tasks, results) if r is not None and not r.ok]
    return valid, rejected

