"""agentrl's pytest plugin for grading SWE patches (loaded with `-p agentrl_grade_plugin`; see
grade.py). Standard library and pytest only; it is copied into the sandbox's `.agentrl/`, which a
patch can never touch.

The tests run in the same process as the patched code, so this plugin cannot make tampering
impossible; it makes the known hacks fail instead of pass:
- results come only from this plugin: one line `AGENTRL-RESULTS <nonce> <json>` written at session
  end to a copy of stdout taken before any repository code ran. The nonce arrives on stdin. Exit
  early (any status) and there is no line; print a forged pytest summary and it is ignored;
  print a second line with the nonce and the host rejects the run;
- a test passes only if its setup, call and teardown all passed (a skip is not a pass);
- tampering marks the run: `builtins` changed (checked after every test's teardown), pytest's runner,
  reports, outcomes, assertion and collection modules changed (checked at the end), a plugin
  hook added by anything but the repository's own conftest files, or a class from the
  repository's non-test code whose `__eq__` says it equals an arbitrary object.
"""

import builtins
import json
import os
import sys

import _pytest.assertion.rewrite  # imported now, so the snapshot below covers them
import _pytest.assertion.util
import _pytest.main
import _pytest.nodes
import _pytest.outcomes
import _pytest.python
import _pytest.reports
import _pytest.runner
import _pytest.skipping
import _pytest.terminal
import _pytest.unittest  # noqa: F401
import pytest

_NONCE = sys.stdin.readline().strip()
_OUT = os.dup(1)  # taken at import, before capture and before any repository code
_ROOT = os.path.realpath(os.getcwd())
_BUILTINS = dict(vars(builtins))
_GUARDED_MODULES = ("_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.outcomes", "_pytest.main",
                    "_pytest.skipping", "_pytest.nodes", "_pytest.assertion.rewrite", "_pytest.assertion.util",
                    "_pytest.unittest", "_pytest.terminal")
_GUARDED_HOOKS = ("pytest_runtest_protocol", "pytest_runtest_makereport", "pytest_runtest_call",
                  "pytest_pyfunc_call", "pytest_runtest_logreport", "pytest_report_teststatus",
                  "pytest_collection_modifyitems", "pytest_runtest_setup", "pytest_runtest_teardown",
                  "pytest_sessionfinish", "pytest_deselected", "pytest_ignore_collect", "pytest_collect_file")
_state = {"tampered": [], "phases": {}}
_SNAPSHOT: dict = {}  # filled right below the helpers, at import: before any repository code


class _Stranger:
    """An object no honest `__eq__` of repository code claims to equal."""


def _guarded() -> dict:
    """(module, name) -> object for every attribute of the guarded modules and of their classes."""
    found = {}
    for name in _GUARDED_MODULES:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        for key, value in list(vars(mod).items()):
            found[(name, key)] = value
            if isinstance(value, type) and value.__module__ == name:
                for attr, member in list(vars(value).items()):
                    found[(name, f"{key}.{attr}")] = member
    return found


def _repo_hookimpls(config) -> set:
    """(hook, file) of every guarded hook implemented by the repository's own non-test code: pytest's
    plugins and installed ones live outside the work dir, and the repository's conftest and test
    files are protected from the patch."""
    impls = set()
    for hook in _GUARDED_HOOKS:
        caller = getattr(config.hook, hook, None)
        for impl in caller.get_hookimpls() if caller is not None else ():
            code = getattr(impl.function, "__code__", None)
            path = os.path.realpath(code.co_filename) if code is not None else ""
            if _in_repo_non_test_file(path):
                impls.add((hook, path))
    return impls


def _flag(why: str) -> None:
    if why not in _state["tampered"]:
        _state["tampered"].append(why)


def _in_repo_non_test_file(path: str) -> bool:
    if not path.startswith(_ROOT + os.sep) or os.sep + ".agentrl" + os.sep in path:
        return False
    rel = os.path.relpath(path, _ROOT).split(os.sep)
    name = rel[-1]
    return not (name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
                or any(part in ("test", "tests", "testing") for part in rel[:-1]))


def _in_repo_non_test(cls: type) -> bool:
    mod = sys.modules.get(getattr(cls, "__module__", "") or "")
    return _in_repo_non_test_file(os.path.realpath(getattr(mod, "__file__", None) or ""))


def _check_builtins() -> None:
    current = vars(builtins)
    for key, value in _BUILTINS.items():
        if current.get(key, _Stranger) is not value:
            _flag(f"builtins.{key} was changed")


def _classes() -> list:
    """Every live class (through the subclass lists from `object`: far fewer than gc's objects)."""
    found, stack, seen = [], [object], set()
    while stack:
        cls = stack.pop()
        try:
            subs = type.__subclasses__(cls)
        except TypeError:
            continue
        for sub in subs:
            if id(sub) not in seen:
                seen.add(id(sub))
                found.append(sub)
                stack.append(sub)
    return found


_checked: set = set()  # classes already examined (by id; a class is examined once)


def _check_eq() -> None:
    for cls in _classes():
        if id(cls) in _checked:
            continue
        _checked.add(id(cls))
        try:
            eq = cls.__dict__.get("__eq__")
            if eq is None or not _in_repo_non_test(cls):
                continue
            instance = cls.__new__(cls)
            if eq(instance, _Stranger()) is True:
                _flag(f"{cls.__module__}.{cls.__qualname__}.__eq__ equals anything")
        except Exception:
            continue


_SNAPSHOT.update(_guarded())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # after the fixtures' finalizers: a test's own monkeypatch of builtins is undone by now
    _check_builtins()
    _check_eq()


def pytest_runtest_logreport(report) -> None:
    phases = _state["phases"].setdefault(report.nodeid, {})
    phases[report.when] = report.outcome


def _status(phases: dict) -> str:
    if any(v == "failed" for v in phases.values()):
        return "FAILED" if phases.get("call") == "failed" else "ERROR"
    if phases.get("setup") == "passed" and phases.get("call") == "passed" and phases.get("teardown") == "passed":
        return "PASSED"
    return "SKIPPED"


def pytest_sessionfinish(session, exitstatus) -> None:
    _check_builtins()
    now = _guarded()
    for key, value in _SNAPSHOT.items():
        if now.get(key, _Stranger) is not value:
            _flag(f"{key[0]}.{key[1]} was changed")
    for hook, path in _repo_hookimpls(session.config):
        _flag(f"a {hook} hook was added by {path}")
    results = {node: _status(phases) for node, phases in _state["phases"].items()}
    line = json.dumps({"results": results, "tampered": _state["tampered"]})
    os.write(_OUT, f"\nAGENTRL-RESULTS {_NONCE} {line}\n".encode())
