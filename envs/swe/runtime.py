"""SWE task runtimes: the Python environment a task's tests run in, never agentrl's own venv.

A runtime is a venv per (package, version, sandbox Python), built once on the host from the
sandbox's own `python3` (so it runs inside bubblewrap, which shows the host's /usr), holding
pytest, the package's declared test dependencies and its install dependencies, but not the
package itself: the package is the task's source tree in the sandbox work dir.

    ~/.cache/agentrl/swe/runtimes/inflection-0.5.1-py3.11/    (or $AGENTRL_SWE_RUNTIMES)

Builds run under a file lock (two processes never build the same runtime), in a temp dir that
is renamed into place only when complete (a crash leaves no half runtime). pip's cache makes a
rebuild fast. Inside a local sandbox the runtime is mounted read-only at RUNTIME_MOUNT and its
bin/ leads PATH, so the agent's `python3 -m pytest` and the grader both use it; a sandbox the env
did not make (a shared pool) gets the runtime's site-packages uploaded instead (grade.py).
Docker tasks use their per-package image (images.build_image), built from the base image alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import functools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentrl.sandboxes import Limits, LocalSandbox, ProcessSandbox, make_sandbox

from .schema import resolve_source
from .source import analyse_repo, unpack

RUNTIME_MOUNT = "/opt/agentrl/runtime"  # where a local sandbox sees its task's runtime (read-only)
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"  # PATH inside a local sandbox (AgentSandbox's default)
MARKER = "agentrl-runtime.json"  # written last: a runtime dir without it is not complete
PIP_TIMEOUT_S = 900


class RuntimeBuildError(RuntimeError):
    """A runtime could not be built; the message says which package and why."""


@dataclass(frozen=True)
class RuntimeSpec:
    """What a runtime holds: one package's dependencies (the package itself comes from the task)."""

    package: str  # NAME==VERSION, or "" for a pytest-only runtime (tasks that name no package)
    archive: str = ""  # host path of the sdist, to read its declared test and install dependencies
    pythonpath: tuple[str, ...] = ()  # import roots inside the work dir (e.g. "src")

    @property
    def name(self) -> str:
        return re.sub(r"[^a-z0-9.]+", "-", self.package.lower().replace("==", "-")) or "pytest-only"


@dataclass(frozen=True)
class Runtime:
    key: str  # e.g. inflection-0.5.1-py3.11
    path: Path  # host path of the venv

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def site_packages(self) -> Path:
        found = sorted(self.path.glob("lib/python3*/site-packages"))
        if not found:
            raise RuntimeBuildError(f"runtime {self.path} has no lib/python3*/site-packages")
        return found[0]

    def info(self) -> dict[str, Any]:
        return json.loads((self.path / MARKER).read_text())


@functools.cache
def sandbox_python() -> tuple[Path, str]:
    """The interpreter a local sandbox runs as `python3` (host path) and its X.Y version."""
    found = shutil.which("python3", path=SANDBOX_PATH)
    if found is None:
        raise RuntimeBuildError(f"no python3 on {SANDBOX_PATH}; SWE sandboxes need the system Python "
                                "(install it with: apt-get install -y python3 python3-venv)")
    exe = Path(found).resolve()
    version = subprocess.run([str(exe), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    return exe, version


def runtime_root() -> Path:
    """$AGENTRL_SWE_RUNTIMES, else ~/.cache/agentrl/swe/runtimes. As root, bubblewrap runs as uid
    65534, which must be able to walk to the mounted runtime; a home it cannot enter (/root is
    0700) falls back to /var/cache/agentrl/swe-runtimes."""
    if os.environ.get("AGENTRL_SWE_RUNTIMES"):
        return Path(os.environ["AGENTRL_SWE_RUNTIMES"]).expanduser()
    home = Path("~/.cache/agentrl/swe/runtimes").expanduser()
    if os.geteuid() == 0 and not _reachable_by_others(home):
        return Path("/var/cache/agentrl/swe-runtimes")
    return home


def _reachable_by_others(path: Path) -> bool:
    for parent in [path, *path.parents]:
        if parent.exists() and not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    return True


def runtime_key(spec: RuntimeSpec, py_version: str) -> str:
    return f"{spec.name}-py{py_version}"


def spec_of(task: dict[str, Any]) -> RuntimeSpec:
    """The runtime a task needs (its sdist is resolved lazily: only a build reads it)."""
    setup = task.get("environment_setup") or {}
    return RuntimeSpec(setup.get("package", ""), "", tuple(setup.get("pythonpath", ())))


def find_runtime(spec: RuntimeSpec, root: Path | None = None) -> Runtime | None:
    """The built runtime for `spec`, or None if it is not built yet."""
    _, version = sandbox_python()
    key = runtime_key(spec, version)
    path = (root or runtime_root()) / key
    return Runtime(key, path) if (path / MARKER).exists() else None


def runtime_fingerprint(task: dict[str, Any]) -> str:
    """Which build of the task's local runtime is on disk ("unbuilt" if none): part of the
    validation cache key, so a rebuilt runtime re-validates its tasks."""
    try:
        runtime = find_runtime(spec_of(task))
    except RuntimeBuildError:  # no system python3 (a docker-only host): no local runtime at all
        return "no-local-python"
    if runtime is None:
        return "unbuilt"
    return f"{runtime.key}@{runtime.info().get('built_at', 0)}"


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_runtime(spec: RuntimeSpec, root: Path | None = None, log: Callable[[str], None] | None = None,
                   ) -> Runtime:
    """The runtime for `spec`, built on first use (locked, atomic); raises RuntimeBuildError."""
    root = root or runtime_root()
    exe, version = sandbox_python()
    key = runtime_key(spec, version)
    final = root / key
    if (final / MARKER).exists():
        return Runtime(key, final)
    with _lock(root / ".locks" / f"{key}.lock"):
        if (final / MARKER).exists():  # another process built it while we waited
            return Runtime(key, final)
        if log:
            log(f"building the task runtime {key} (pytest and {spec.package or 'no package'}'s dependencies)")
        start = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=root))
        try:
            requirements = _build(spec, exe, tmp)
            shutil.rmtree(final, ignore_errors=True)  # a stale dir without a marker
            _make_readable(tmp)
            (tmp / MARKER).write_text(json.dumps({
                "key": key, "package": spec.package, "python": str(exe), "python_version": version,
                "requirements": requirements, "pythonpath": list(spec.pythonpath),
                "build_seconds": round(time.perf_counter() - start, 2), "built_at": time.time()}, indent=1))
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return Runtime(key, final)


def _build(spec: RuntimeSpec, exe: Path, venv: Path) -> list[str]:
    """Make the venv and pip-install into it; returns the requirements installed."""
    _run([str(exe), "-m", "venv", "--without-pip", str(venv)], f"python3 -m venv for {spec.name}")
    requirements = ["pytest"]
    name = spec.package.split("==")[0]
    if spec.package:
        archive = Path(spec.archive) if spec.archive else None
        if archive is not None and archive.exists():
            requirements += _declared_test_requirements(archive)
            requirements.append(str(archive))  # its install dependencies; the package itself is removed below
        else:
            requirements.append(spec.package)
    # pip from the interpreter running agentrl, pointed at the runtime (`--python`): the runtime
    # needs no pip of its own, and nothing of agentrl's venv is installed into it.
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "--disable-pip-version-check"]
    _run([*pip, "install", "-q", *requirements], f"pip install for {spec.name}")
    if spec.package:
        _run([*pip, "uninstall", "-y", "-q", name], f"pip uninstall {name}")
    site = sorted(venv.glob("lib/python3*/site-packages"))[0]
    # the repo's import roots, so the agent's own `python3 -m pytest` imports a src/ layout too
    (site / "agentrl-repo.pth").write_text("".join(f"/work/{p}\n" for p in spec.pythonpath))
    return requirements


def _declared_test_requirements(archive: Path) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            return analyse_repo(unpack(archive, Path(tmp))).test_requirements
        except ValueError:
            return []


def _run(cmd: list[str], what: str) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeBuildError(f"{what} timed out after {PIP_TIMEOUT_S} s") from None
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-6:]
        raise RuntimeBuildError(f"{what} failed: {' | '.join(tail)}")


def _make_readable(path: Path) -> None:
    """Everyone may read and enter the runtime (bubblewrap may run as uid 65534)."""
    for p in [path, *path.rglob("*")]:
        if not p.is_symlink():
            mode = p.stat().st_mode
            p.chmod(mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
                    | (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH if p.is_dir() else 0))


# ---------------------------------------------------------------------------------------------
# Many runtimes: `agentrl swe build`, and what `train --env swe` prepares before the first rollout
# ---------------------------------------------------------------------------------------------


def task_specs(tasks: Iterable[dict[str, Any]]) -> dict[RuntimeSpec, list[str]]:
    """The distinct runtimes a task set needs → the instance ids that need each."""
    out: dict[RuntimeSpec, list[str]] = {}
    for t in tasks:
        out.setdefault(spec_of(t), []).append(t["instance_id"])
    return out


def _with_archive(spec: RuntimeSpec, task: dict[str, Any]) -> RuntimeSpec:
    archive = resolve_source(task)
    return RuntimeSpec(spec.package, str(archive) if archive else "", spec.pythonpath)


@dataclass
class BuildReport:
    built: list[str]
    cached: list[str]
    failed: dict[str, str]  # runtime name → why
    seconds: float


def ensure_runtimes(tasks: list[dict[str, Any]], *, workers: int = 2, root: Path | None = None,
                    progress: Callable[[str, str], None] | None = None) -> BuildReport:
    """Build every missing runtime of `tasks` (in parallel); `progress(name, status)` is called
    once per runtime with status built|cached|failed."""
    start = time.perf_counter()
    specs = task_specs(tasks)
    first = {spec: next(t for t in tasks if t["instance_id"] == ids[0]) for spec, ids in specs.items()}
    report = BuildReport([], [], {}, 0.0)

    def one(spec: RuntimeSpec) -> tuple[RuntimeSpec, str, str]:
        if find_runtime(spec, root) is not None:
            return spec, "cached", ""
        try:
            ensure_runtime(_with_archive(spec, first[spec]), root)
        except Exception as e:  # a package that cannot be installed fails alone
            return spec, "failed", f"{type(e).__name__}: {e}"
        return spec, "built", ""

    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        futures = [pool.submit(one, s) for s in sorted(specs, key=lambda s: s.name)]
        for future in concurrent.futures.as_completed(futures):
            spec, status, why = future.result()
            {"built": report.built, "cached": report.cached}.get(status, []).append(spec.name)
            if status == "failed":
                report.failed[spec.name] = why
            if progress:
                progress(spec.name, status)
    report.seconds = time.perf_counter() - start
    return report


# ---------------------------------------------------------------------------------------------
# Runtimes inside sandboxes
# ---------------------------------------------------------------------------------------------


def task_runtime(task: dict[str, Any], log: Callable[[str], None] | None = None) -> Runtime:
    """The task's runtime, built now if missing (blocking)."""
    spec = spec_of(task)
    found = find_runtime(spec)
    return found if found is not None else ensure_runtime(_with_archive(spec, task), log=log)


def sandbox_with_runtime(cls: type, limits: Any, runtime: Runtime) -> Any:
    """A fresh sandbox of `cls` (LocalSandbox or its no-isolation subclass ProcessSandbox) whose
    `python3` is the runtime's: bubblewrap mounts it read-only at RUNTIME_MOUNT; a process
    sandbox, which sees the host, uses it in place."""
    if issubclass(cls, ProcessSandbox):
        sandbox = cls(limits)
        bin_dir = str(runtime.path / "bin")
    else:
        sandbox = cls(limits, ro_binds=((str(runtime.path), RUNTIME_MOUNT),))
        bin_dir = f"{RUNTIME_MOUNT}/bin"
    sandbox.base_env["PATH"] = f"{bin_dir}:{sandbox.base_env['PATH']}"
    sandbox.base_env["AGENTRL_SWE_RUNTIME"] = runtime.key
    return sandbox


# What a sandbox offers: its python3 is a runtime's (mounted, or in place on the process backend),
# a docker task image has pytest built in, or neither (then the runtime is uploaded).
_PROBE = ('if [ -n "$AGENTRL_SWE_RUNTIME" ]; then echo runtime; '
          "elif [ -f /.dockerenv ] && python3 -c 'import pytest' 2>/dev/null; then echo image; "
          "else python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'; fi")


async def provide_runtime(sandbox: Any, task: dict[str, Any], site_dir: str) -> None:
    """Make pytest and the package's dependencies importable by the sandbox's `python3`, from the
    task runtime and never from agentrl's venv. A sandbox made without the runtime (a shared
    pool's) gets the runtime's site-packages uploaded to `site_dir`."""
    r = await sandbox.exec(_PROBE, timeout=30)
    answer = r.stdout.strip()
    if not r.ok:
        raise RuntimeError(f"task {task.get('instance_id')}: cannot probe the sandbox's python3: "
                           f"{(r.stderr or r.stdout)[-300:]}")
    if answer in ("runtime", "image"):
        return
    runtime = await asyncio.to_thread(task_runtime, task)
    want = runtime.key.rsplit("-py", 1)[1]
    if answer != want:
        raise RuntimeError(f"task {task.get('instance_id')}: the sandbox runs Python {answer} but the task "
                           f"runtime {runtime.key} was built for {want}; use a sandbox image with Python {want} "
                           "or the per-package image (sandbox.backend=docker builds it)")
    await sandbox.upload(str(runtime.site_packages()), site_dir)


async def make_task_sandbox(cfg: Any, task: dict[str, Any], log: Callable[[str], None] | None = print) -> Any:
    """A fresh sandbox for `task` under sandbox config `cfg`: on the local and process backends
    with the task's runtime (built first if missing), on docker of the task's image."""
    if cfg.backend in ("local", "process"):
        runtime = await asyncio.to_thread(task_runtime, task, log)
        cls = LocalSandbox if cfg.backend == "local" else ProcessSandbox
        return sandbox_with_runtime(cls, Limits.from_config(cfg), runtime)
    return make_sandbox(replace(cfg, image=task.get("image") or cfg.image))


def default_workers() -> int:
    """Sandboxes to run task tests in at once: one per core (a pytest run is one process), at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


@contextlib.asynccontextmanager
async def task_sandboxes(cfg: Any, task: dict[str, Any], n: int,
                         log: Callable[[str], None] | None = print) -> AsyncIterator[list[Any]]:
    """`n` fresh sandboxes for `task` (make_task_sandbox), all closed on exit."""
    if n < 1:
        raise ValueError(f"workers must be >= 1, got {n}")
    sandboxes: list[Any] = []
    try:
        for _ in range(n):  # in turn: the first one builds a missing runtime, the others reuse it
            sandboxes.append(await make_task_sandbox(cfg, task, log=log))
        yield sandboxes
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))


async def on_each(sandboxes: list[Any], work: Callable[[Any], Awaitable[None]]) -> None:
    """Run `work(sandbox)` on every sandbox at once; the first failure cancels the others (so none
    is still running when the sandboxes close) and is raised."""
    running = [asyncio.ensure_future(work(s)) for s in sandboxes]
    try:
        await asyncio.gather(*running)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


def frozen_requirements(runtime: Runtime) -> list[str]:
    """The runtime's installed distributions as NAME==VERSION pins (a docker image built from
    them runs the same versions as the local backend)."""
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(runtime.python), "list", "--format=freeze",
                        "--disable-pip-version-check"], capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeBuildError(f"pip list in {runtime.path} failed: {_tail_of(r.stderr)}")
    return [line for line in r.stdout.splitlines() if "==" in line]


def _tail_of(text: str) -> str:
    return " | ".join(text.strip().splitlines()[-3:])
