"""Published SWE dataset formats (envs/swe/datasets.py) on records built from their published
schemas (SWE-bench, SWE-Gym, SWE-smith dataset cards), JSONL and parquet; bad input lines."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from agentrl.envs.swe.datasets import detect, requirements, reverse_patch, swe_bench_image
from agentrl.envs.swe.env import SWEEnv
from agentrl.envs.swe.mutate import unified_diff
from agentrl.envs.swe.schema import TaskError, builtin_tasks, load_tasks, save_tasks

BUG = unified_diff("pkg/mod.py", "def f(x):\n    if x < 0:\n        return 0\n    return x + 1\n",
                   "def f(x):\n    return x - 1\n")
# SWE-bench (princeton-nlp/SWE-bench card): FAIL_TO_PASS / PASS_TO_PASS are JSON-encoded strings
SWE_BENCH = {"repo": "psf/requests", "instance_id": "psf__requests-1234", "base_commit": "a" * 40,
             "patch": BUG, "test_patch": "", "problem_statement": "f(-1) returns -2", "hints_text": "",
             "created_at": "2023-01-01T00:00:00Z", "version": "2.0",
             "FAIL_TO_PASS": '["tests/test_mod.py::test_f"]', "PASS_TO_PASS": "[]",
             "environment_setup_commit": "b" * 40}
# SWE-Gym (SWE-Gym/SWE-Gym card): the same fields, lists as lists
SWE_GYM = {**SWE_BENCH, "instance_id": "getmoto__moto-1", "FAIL_TO_PASS": ["tests/test_mod.py::test_f"],
           "PASS_TO_PASS": ["tests/test_mod.py::test_g"]}
# SWE-smith (SWE-bench/SWE-smith card): `patch` is the bug, the repo is inside `image_name`
SWE_SMITH = {"instance_id": "oauthlib__oauthlib.1fd52536.func_basic__abc", "repo": "swesmith/oauthlib__oauthlib.1fd52536",
             "patch": BUG, "FAIL_TO_PASS": ["tests/test_mod.py::test_f"], "PASS_TO_PASS": [],
             "image_name": "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
             "problem_statement": "f is wrong"}


def test_formats_are_detected_and_mapped(tmp_path: Path) -> None:
    assert [detect(r) for r in (SWE_BENCH, SWE_GYM, SWE_SMITH)] == ["swe-bench", "swe-bench", "swe-smith"]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (SWE_BENCH, SWE_GYM, SWE_SMITH)))
    bench, gym, smith = load_tasks(path)
    assert bench["FAIL_TO_PASS"] == ["tests/test_mod.py::test_f"] and gym["PASS_TO_PASS"] == ["tests/test_mod.py::test_g"]
    assert bench["image"] == swe_bench_image("psf__requests-1234") == \
        "swebench/sweb.eval.x86_64.psf_1776_requests-1234:latest"
    assert bench["environment_setup"]["repo_dir"] == "/testbed" and bench["patch"] == BUG
    assert smith["image"] == SWE_SMITH["image_name"] and smith["bug_patch"] == BUG
    assert smith["patch"] == reverse_patch(BUG) != BUG
    # what agentrl cannot run is said in one line: no source shipped, so only docker with the image
    assert "network clone" in requirements(bench, "local") and requirements(bench, "docker") == ""
    assert requirements(builtin_tasks()[0], "local") == ""


def test_parquet_in_the_published_layouts(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([SWE_SMITH]), tmp_path / "smith.parquet")  # list<string> columns
    pq.write_table(pa.Table.from_pylist([SWE_BENCH]), tmp_path / "bench.parquet")  # string columns
    (smith,), (bench,) = load_tasks(tmp_path / "smith.parquet"), load_tasks(tmp_path / "bench.parquet")
    assert smith["FAIL_TO_PASS"] == ["tests/test_mod.py::test_f"] and smith["dataset_format"] == "swe-smith"
    assert bench["FAIL_TO_PASS"] == ["tests/test_mod.py::test_f"] and bench["dataset_format"] == "swe-bench"


def test_reverse_patch_undoes_the_bug(tmp_path: Path) -> None:
    original = "def f(x):\n    if x < 0:\n        return 0\n    return x + 1\n"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(original)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for patch in (BUG, reverse_patch(BUG)):
        (tmp_path / "p.diff").write_text(patch)
        subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / "pkg" / "mod.py").read_text() == original
    assert reverse_patch(reverse_patch(BUG)) == BUG


def test_gz_round_trip(tmp_path: Path) -> None:
    tasks = builtin_tasks()[:3]
    save_tasks(tasks, tmp_path / "t.jsonl.gz")
    assert gzip.decompress((tmp_path / "t.jsonl.gz").read_bytes()).count(b"\n") == 3
    assert load_tasks(tmp_path / "t.jsonl.gz") == tasks


def test_bad_records_give_one_line_each_and_the_rest_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Missing field, unknown package source, a gold patch that does not apply: each one line
    naming the task; the good task still loads and validates (real bubblewrap)."""
    good = min((t for t in builtin_tasks() if t["instance_id"].startswith("inflection")),
               key=lambda t: len(t["PASS_TO_PASS"]))
    missing = {k: v for k, v in good.items() if k != "problem_statement"} | {"instance_id": "bad-missing"}
    unknown = {**good, "instance_id": "bad-package", "source": "data:nosuchpkg-1.0.tar.gz"}
    noapply = {**good, "instance_id": "bad-patch",
               "patch": good["patch"].replace(good["patch"].splitlines()[5], "-this line is not in the file")}
    path = tmp_path / "tasks.jsonl"
    save_tasks([good, missing, unknown, noapply], path)
    problems: list[str] = []
    assert [t["instance_id"] for t in load_tasks(path, problems)] == [good["instance_id"], "bad-patch"]
    assert len(problems) == 2 and "bad-missing" in problems[0] and "problem_statement" in problems[0]
    assert "bad-package" in problems[1] and "nosuchpkg-1.0.tar.gz not found" in problems[1]
    with pytest.raises(TaskError, match="bad-missing"):
        load_tasks(path)  # strict by default
    env = SWEEnv(task_file=str(path), validation_cache=str(tmp_path / "v.json"))
    assert [t["instance_id"] for t in env.tasks("all")] == [good["instance_id"]]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "bad-" in ln]
    assert len(lines) == 3, lines
    assert "bad-patch rejected" in lines[2] and "does not apply" in lines[2]
