"""SWE synthesis at scale (envs/swe/batch.py): why a package gave no task, splits by package,
shipping a staging dir, and `agentrl swe stats --json`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agentrl.cli import main as cli_main
from agentrl.envs.swe import batch
from agentrl.envs.swe.schema import DATA_DIR, builtin_tasks, load_tasks, save_tasks


def test_why_no_task_is_one_line() -> None:
    out = "E   requests.exceptions.ConnectionError: Temporary failure in name resolution\n1 failed"
    assert batch.diagnose(f"pkg==1: no test passes on the unmodified package:\n{out}") == \
        "its tests need the network (sandboxes have none)"
    why = batch.diagnose("pkg==1: no test passes on the unmodified package:\nModuleNotFoundError: No module named 'yaml'")
    assert "'yaml'" in why and "\n" not in why
    assert "\n" not in batch.diagnose("pkg: no test files (test_*.py, *_test.py, tests/) in the source archive\nmore")


def test_splits_hold_out_whole_packages() -> None:
    names = [f"pkg{i}" for i in range(40)]
    splits = {n: batch.package_split(n) for n in names}
    assert splits == {n: batch.package_split(n) for n in names}  # stable
    assert set(splits.values()) == {"train", "dev", "test"}


def test_ship_points_tasks_at_the_shipped_sdist(tmp_path: Path) -> None:
    core = [t for t in builtin_tasks() if t["instance_id"].startswith("semver")][:2]
    staging = tmp_path / "staging"
    staging.mkdir()
    sdist = shutil.copy(DATA_DIR / "semver-3.0.2.tar.gz", staging / "semver-3.0.2.tar.gz")
    save_tasks([{**t, "source": f"file:{sdist}"} for t in core], staging / "semver-3.0.2.jsonl.gz")
    dest = DATA_DIR / "suite-test-tmp"
    try:
        counts = batch.ship(staging, dest)
        shipped = load_tasks(dest / "semver-3.0.2.jsonl.gz")
        assert [t["source"] for t in shipped] == ["data:suite-test-tmp/semver-3.0.2.tar.gz"] * 2
        assert {t["split"] for t in shipped} == {batch.package_split("semver")} and sum(counts.values()) == 2
        d = shipped[0]["difficulty"]
        assert d["files_changed"] == 1 and d["lines_changed"] >= 2 and d["failing_tests"] == len(core[0]["FAIL_TO_PASS"])
        assert d["operator"] == core[0]["mutation"]["operator"]
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def test_stats_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["swe", "stats", "--json", "--tasks", "core"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["tasks"] == 16 and stats["packages"] == 2
    assert sum(s["tasks"] for s in stats["splits"].values()) == 16
    assert cli_main(["swe", "stats", "--json"]) == 0  # every shipped set
    every = json.loads(capsys.readouterr().out)
    assert every["tasks"] == len(builtin_tasks("all")) >= 16
