"""The SWE task schema and loaders (envs/swe/schema.py), the diff filter and pytest-summary parser
(envs/swe/grade.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.envs.swe.grade import filter_patch, is_protected, parse_pytest_summary, split_patch
from agentrl.envs.swe.schema import TaskError, builtin_tasks, load_tasks, normalize_task, save_tasks

RECORD = {
    "instance_id": "demo__demo-1",
    "repo": "demo/demo",
    "base_commit": "abc123",
    "problem_statement": "x() returns 2, expected 1",
    "patch": "diff --git a/demo.py b/demo.py\n",
    "test_patch": "",
    "FAIL_TO_PASS": json.dumps(["tests/test_demo.py::test_x"]),  # SWE-bench stores JSON strings
    "PASS_TO_PASS": json.dumps(["tests/test_demo.py::test_y", "tests/test_demo.py::test_z[a-b]"]),
    "image": "demo:latest",
    "version": "1.0",  # extra SWE-bench fields are kept
}


def test_normalize_decodes_swebench_string_lists() -> None:
    task = normalize_task(RECORD)
    assert task["id"] == "demo__demo-1"
    assert task["FAIL_TO_PASS"] == ["tests/test_demo.py::test_x"]
    assert task["PASS_TO_PASS"][1] == "tests/test_demo.py::test_z[a-b]"
    assert task["version"] == "1.0" and task["environment_setup"] == {}


def test_jsonl_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(RECORD) + "\n\n" + json.dumps({**RECORD, "instance_id": "demo__demo-2"}) + "\n")
    tasks = load_tasks(path)
    assert [t["id"] for t in tasks] == ["demo__demo-1", "demo__demo-2"]
    save_tasks(tasks, tmp_path / "again.jsonl")
    assert load_tasks(tmp_path / "again.jsonl") == tasks


def test_parquet(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [RECORD, {**RECORD, "instance_id": "demo__demo-2", "FAIL_TO_PASS": '["t.py::a", "t.py::b"]'}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "tasks.parquet")
    tasks = load_tasks(tmp_path / "tasks.parquet")
    assert len(tasks) == 2 and tasks[1]["FAIL_TO_PASS"] == ["t.py::a", "t.py::b"]


@pytest.mark.parametrize(("change", "message"), [
    ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS is empty"),
    ({"FAIL_TO_PASS": "not json"}, "not a JSON list"),
    ({"PASS_TO_PASS": [1, 2]}, "list of pytest node ids"),
    ({"patch": ""}, "missing required field"),
    ({"source": "http://example.com/x.tar.gz"}, "must start with"),
    ({"environment_setup": {"python": "3.8"}}, "unknown environment_setup key"),
])
def test_bad_records_are_named(change: dict, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        normalize_task({**RECORD, **change}, "f.jsonl:3")


def test_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="not found"):
        load_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "t.csv").write_text("a,b")
    with pytest.raises(TaskError, match="unsupported task file type"):
        load_tasks(tmp_path / "t.csv")
    (tmp_path / "t.jsonl").write_text(json.dumps(RECORD) + "\n{oops\n")
    with pytest.raises(TaskError, match=r"t.jsonl:2: not valid JSON"):
        load_tasks(tmp_path / "t.jsonl")
    (tmp_path / "d.jsonl").write_text(json.dumps(RECORD) + "\n" + json.dumps(RECORD) + "\n")
    with pytest.raises(TaskError, match="duplicate instance_id"):
        load_tasks(tmp_path / "d.jsonl")


def test_shipped_tasks_come_from_two_real_packages() -> None:
    tasks = builtin_tasks()
    packages = {t["environment_setup"]["package"] for t in tasks}
    assert len(packages) >= 2 and len(tasks) >= 10
    for t in tasks:
        assert t["source"].startswith("data:") and t["FAIL_TO_PASS"] and t["patch"].startswith("diff --git")
        assert t["bug_patch"] and not any(is_protected(p) for p, _ in split_patch(t["patch"]))
        # the problem statement never quotes a changed line of the fix
        changed = [ln[1:].strip() for ln in t["patch"].splitlines()
                   if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and len(ln.strip()) > 6]
        assert not any(c in t["problem_statement"] for c in changed), t["instance_id"]


PATCH = """\
diff --git a/pkg/core.py b/pkg/core.py
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -1 +1 @@
-x = 1
+x = 2
diff --git a/tests/test_core.py b/tests/test_core.py
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -1 +1 @@
-assert x == 1
+assert True
diff --git a/conftest.py b/conftest.py
new file mode 100644
--- /dev/null
+++ b/conftest.py
@@ -0,0 +1 @@
+import pytest
"""


def test_filter_patch_drops_tests_and_test_config() -> None:
    kept, dropped = filter_patch(PATCH)
    assert dropped == ["tests/test_core.py", "conftest.py"]
    assert [p for p, _ in split_patch(kept)] == ["pkg/core.py"]
    assert is_protected("test_inflection.py") and is_protected("pkg/tests/helpers.py") and is_protected("setup.cfg")
    assert not is_protected("pkg/testing_utils.py") and not is_protected("src/pkg/core.py")
    assert is_protected("src/x.py", {"environment_setup": {"protected": ["src/x.py"]}})


def test_parse_pytest_summary() -> None:
    out = """\
....F
=========================== short test summary info ============================
PASSED tests/test_a.py::test_ok
PASSED tests/test_a.py::test_param[a - b]
FAILED tests/test_a.py::test_bad - AssertionError: assert 'cw' == 'cow'
ERROR tests/test_b.py - ImportError: no module named zzz
SKIPPED [1] tests/test_c.py:3: needs network
1 failed, 2 passed, 1 error in 0.1s
"""
    statuses, messages = parse_pytest_summary(out)
    assert statuses == {"tests/test_a.py::test_ok": "PASSED", "tests/test_a.py::test_param[a - b]": "PASSED",
                        "tests/test_a.py::test_bad": "FAILED", "tests/test_b.py": "ERROR"}
    assert messages["tests/test_a.py::test_bad"] == "AssertionError: assert 'cw' == 'cow'"
