"""SWE task synthesis end to end in real bubblewrap sandboxes: a small package built here (fast),
a real PyPI package the synthesiser was not tuned on (slow, needs PyPI), and validation that
rejects a broken task with its reason."""

from __future__ import annotations

import asyncio
import json
import shutil
import tarfile
import time
from pathlib import Path

import pytest

from agentrl.config import SandboxConfig
from agentrl.envs.swe.cli import main
from agentrl.envs.swe.grade import ValidationCache, task_key, validate_task, validate_tasks
from agentrl.envs.swe.images import dockerfile
from agentrl.envs.swe.runtime import MARKER, on_each, runtime_key, sandbox_python, spec_of
from agentrl.envs.swe.schema import load_tasks
from agentrl.envs.swe.source import analyse_repo, parse_spec, unpack
from agentrl.envs.swe.source import test_requirements as requirements_for_tests  # not a test itself
from agentrl.envs.swe.synth import problem_statement, related_tests, synthesize
from agentrl.sandboxes import LocalSandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

LIB = '''\
def mean(xs):
    if not xs:
        raise ValueError("mean of nothing")
    return sum(xs) / len(xs)


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def window(xs, n):
    return [xs[i:i + n] for i in range(len(xs) - n + 1)]
'''
TESTS = '''\
import pytest
from minilib import clamp, mean, window


def test_mean():
    assert mean([1, 2, 3, 6]) == 3

def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])

@pytest.mark.parametrize("x,want", [(-5, 0), (5, 5), (50, 10)])
def test_clamp(x, want):
    assert clamp(x, 0, 10) == want

def test_window():
    assert window([1, 2, 3, 4], 2) == [[1, 2], [2, 3], [3, 4]]
'''


def make_sdist(folder: Path) -> Path:
    """A real sdist-shaped tarball: minilib-0.1/{minilib/__init__.py, tests/test_minilib.py}."""
    src = folder / "build" / "minilib-0.1"
    (src / "minilib").mkdir(parents=True)
    (src / "tests").mkdir()
    (src / "minilib" / "__init__.py").write_text(LIB)
    (src / "tests" / "test_minilib.py").write_text(TESTS)
    (src / "setup.py").write_text("from setuptools import setup\nsetup(name='minilib', version='0.1')\n")
    archive = folder / "minilib-0.1.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname="minilib-0.1")
    return archive


def test_layout_and_helpers(tmp_path: Path) -> None:
    root = unpack(make_sdist(tmp_path), tmp_path / "x")
    layout = analyse_repo(root)
    assert layout.source_files == ["minilib/__init__.py"] and layout.test_files == ["tests/test_minilib.py"]
    assert parse_spec("more-itertools==10.5.0") == ("more-itertools", "10.5.0")
    with pytest.raises(ValueError, match="NAME==VERSION"):
        parse_spec("toolz>=1")
    text = dockerfile("agentrl-base:bookworm", ["hypothesis"], with_ca=False)
    assert "FROM agentrl-base:bookworm" in text and "'pytest' 'hypothesis'" in text
    # behind a TLS-intercepting proxy the CA reaches pip's build-isolation subprocess too
    with_ca = dockerfile("agentrl-base:bookworm", [], with_ca=True)
    assert "PIP_CERT=/tmp/host-ca.crt /tmp/pipenv/bin/pip install --cert /tmp/host-ca.crt" in with_ca


def test_tox_factor_conditional_deps_are_left_out(tmp_path: Path) -> None:
    # tox.ini pins of one tox env ("django22: Django>=2.2,<2.3", "py{26,27}: ...") are not pip
    # syntax: passed on, they broke the runtime builds of semantic_version, python-slugify, hyperlink
    (tmp_path / "tox.ini").write_text("[testenv]\ndeps =\n    pytest-cov\n    hypothesis>=6\n"
                                      "    django22: Django>=2.2,<2.3\n    py{26,27,py2}: typing==3.7.4\n"
                                      "    !py27: attrs  # a comment\n    -rrequirements.txt\n")
    assert requirements_for_tests(tmp_path) == ["hypothesis>=6"]
    fix = "-    if x <= lo:\n+    if x < lo:\n"
    quoting = problem_statement("minilib", ["t.py::a"], {"t.py::a": "SyntaxError near 'if x < lo:'"}, fix)
    assert "`t.py::a`" in quoting and "x < lo" not in quoting  # a message quoting the fix is left out
    plain = problem_statement("minilib", ["t.py::a"], {"t.py::a": "assert 0 == -5"}, fix)
    assert "`t.py::a`: assert 0 == -5" in plain
    failing = ["tests/test_m.py::TestClamp::test_clamp_low[1-2]", "tests/test_m.py::test_mean_empty"]
    report = problem_statement("minilib", failing, {failing[1]: "assert 0 == -5", failing[0]: "near 'if x < lo:'"},
                               fix, style="report")
    assert "Clamp: clamp low (1-2)" in report and "- mean empty: assert 0 == -5" in report
    assert "::" not in report and "test_m.py" not in report and "x < lo" not in report  # no test id, no leak


def test_mutants_run_their_modules_tests_first() -> None:
    tests = ["toolz/tests/test_itertoolz.py", "toolz/tests/test_dicttoolz.py"]
    assert related_tests("toolz/itertoolz.py", tests) == ["toolz/tests/test_itertoolz.py"]
    assert related_tests("src/semver/__init__.py", ["tests/test_semver.py", "tests/test_x.py"]) == ["tests/test_semver.py"]
    assert related_tests("pkg/core.py", tests) == tests  # no test file named after it: all of them


@pytest.mark.slow  # ~20 s on an idle 2-core machine, ~50 s under load
def test_synthesise_and_validate_a_small_package(tmp_path: Path) -> None:
    archive = make_sdist(tmp_path)
    cfg = SandboxConfig(backend="local", timeout_s=60.0, pids=256, max_output_bytes=8_000_000)
    tasks, stats = asyncio.run(synthesize("minilib==0.1", cfg, max_tasks=3, max_candidates=40, max_failing=3,
                                          archive_dir=tmp_path, source_ref=f"file:{archive}", log=lambda _: None))
    assert stats.baseline_tests == 6 and len(tasks) == 3 and stats.tried >= 3
    # two sandboxes at once keep the same tasks: the first max_tasks in the sampled order
    tasks2, stats2 = asyncio.run(synthesize("minilib==0.1", cfg, max_tasks=3, max_candidates=40, max_failing=3,
                                            archive_dir=tmp_path, source_ref=f"file:{archive}", log=lambda _: None,
                                            workers=2))
    assert [t["instance_id"] for t in tasks2] == [t["instance_id"] for t in tasks]
    assert stats2.baseline_tests == 6 and stats2.tried >= stats.tried
    for t in tasks:
        assert 1 <= len(t["FAIL_TO_PASS"]) <= 3
        assert set(t["FAIL_TO_PASS"]).isdisjoint(t["PASS_TO_PASS"])
        assert len(t["FAIL_TO_PASS"]) + len(t["PASS_TO_PASS"]) == 6
        assert t["patch"].startswith("diff --git a/minilib/__init__.py")
        assert t["instance_id"].startswith("minilib-0.1-") and t["source"] == f"file:{archive}"

    async def check() -> None:
        sandbox = LocalSandbox()
        try:
            good = await validate_task(tasks[0], sandbox)
            assert good.ok, good.reason
            # a broken task: its "gold" patch is the bug itself, so the tests still fail
            broken = {**tasks[0], "patch": tasks[1]["patch"]}  # another bug's fix does not fix this one
            bad = await validate_task(broken, sandbox)
            assert not bad.ok and "does not resolve" in bad.reason
            # a task whose FAIL_TO_PASS already passes without any patch
            trivial = {**tasks[0], "FAIL_TO_PASS": tasks[0]["PASS_TO_PASS"][:1],
                       "PASS_TO_PASS": tasks[0]["PASS_TO_PASS"][1:]}
            assert (await validate_task(trivial, sandbox)).ok is False
            # a task whose gold patch touches a test file is rejected with that reason
            cheat = {**tasks[0], "patch": tasks[0]["patch"].replace("minilib/__init__.py", "tests/test_minilib.py")}
            assert "protected" in (await validate_task(cheat, sandbox)).reason
            # validation results are cached per task content and backend
            cache = ValidationCache(tmp_path / "cache.json")
            ok, rejected = await validate_tasks([tasks[0], broken], [sandbox], "local", cache)
            assert [t["id"] for t in ok] == [tasks[0]["id"]] and rejected[0][0] == broken["id"]
            again = ValidationCache(tmp_path / "cache.json")
            lines: list[str] = []
            ok2, rejected2 = await validate_tasks([tasks[0], broken], [sandbox], "local", again, log=lines.append)
            assert [t["id"] for t in ok2] == [tasks[0]["id"]] and rejected2 == rejected
            assert len(again.data) == 2 and all(line.endswith("(cached)") for line in lines), lines
            # on two sandboxes at once: the same verdicts, in the tasks' order
            second = LocalSandbox()
            try:
                both = [broken, tasks[0], tasks[1]]
                ok3, rejected3 = await validate_tasks(both, [sandbox, second], "local",
                                                      ValidationCache(tmp_path / "two.json"))
            finally:
                await second.close()
            assert [t["id"] for t in ok3] == [tasks[0]["id"], tasks[1]["id"]] and rejected3 == rejected
        finally:
            await sandbox.close()

    asyncio.run(check())


def test_the_validation_key_changes_when_the_task_runtime_is_rebuilt(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_SWE_RUNTIMES", str(tmp_path))
    task = {"instance_id": "x-1", "environment_setup": {"package": "minilib==0.1"}, "patch": "p"}
    unbuilt = task_key(task, "local")
    _, version = sandbox_python()
    marker = tmp_path / runtime_key(spec_of(task), version) / MARKER
    marker.parent.mkdir()
    marker.write_text(json.dumps({"built_at": 1.0}))
    built = task_key(task, "local")
    assert task_key(task, "local") == built != unbuilt  # stable while the build stays
    marker.write_text(json.dumps({"built_at": 2.0}))  # rebuilt (e.g. after a broken one was removed)
    assert task_key(task, "local") not in (built, unbuilt)
    assert task_key(task, "docker") != task_key(task, "local")


def test_cli_errors_are_clear(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["synth", "--package", "toolz"]) == 1
    assert "NAME==VERSION" in capsys.readouterr().err
    assert main(["validate", "core", "--workers", "0"]) == 1
    assert capsys.readouterr().err.strip() == "error: --workers must be >= 1, got 0"


@pytest.mark.slow
def test_synth_cli_on_an_untuned_pypi_package(tmp_path: Path) -> None:
    """toolz was never used while writing the synthesiser (tuned on inflection and semver)."""
    out = tmp_path / "toolz.jsonl"
    code = main(["synth", "--package", "toolz==1.0.0", "--max-tasks", "2", "--max-candidates", "40",
                 "--out", str(out), "--validate"])
    assert code == 0
    tasks = load_tasks(out)
    assert len(tasks) == 2 and all(t["environment_setup"]["package"] == "toolz==1.0.0" for t in tasks)
    assert (tmp_path / "toolz-1.0.0.tar.gz").exists()


def test_work_on_each_sandbox_stops_everywhere_when_one_fails() -> None:
    """A failure on one sandbox (e.g. truncated pytest output) cancels the others' work before the
    sandboxes close, and is raised."""
    cancelled: list[str] = []

    async def work(sandbox: str) -> None:
        if sandbox == "bad":
            raise RuntimeError("boom")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(sandbox)
            raise

    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(on_each(["ok", "bad"], work))
    assert cancelled == ["ok"] and time.perf_counter() - start < 5
