"""The SWE task schema (SWE-bench compatible) and loaders for JSONL, JSON and parquet files.

A task is a plain dict (agentrl's `Task`) with SWE-bench's fields:

    instance_id, repo, base_commit, problem_statement, patch (gold), test_patch,
    FAIL_TO_PASS, PASS_TO_PASS (lists of pytest node ids), image

plus two of ours:

    source             where the repository comes from, one of
                         "data:<file>"        an archive shipped in envs/swe/data/
                         "file:<path>"        an archive on this machine
                         "pip:NAME==VERSION"  a pip sdist, downloaded on first use
                         ""                   the repo is already inside `image`: at the work
                                              dir, or at environment_setup.repo_dir (SWE-bench
                                              images: "/testbed"), copied to the work dir
    bug_patch          a diff applied on top of the source before the agent starts (synthesised
                       tasks: the injected bug; the gold `patch` is its reverse)
    environment_setup  {"package": "NAME==VERSION", "pythonpath": [...], "test_files": [...],
                        "protected": [...], "test_cmd": str (replaces `python3 -m pytest ...`),
                        "timeout_s": float, "repo_dir": str}

SWE-bench stores FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded strings; `normalize_task` decodes
them. `id` mirrors `instance_id` (agentrl's Task key).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
REQUIRED = ("instance_id", "problem_statement", "patch", "FAIL_TO_PASS")
LIST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")
SETUP_KEYS = {"pythonpath", "test_files", "protected", "test_cmd", "timeout_s", "package", "repo_dir"}


class TaskError(ValueError):
    """A task file or record is malformed; the message names the file, record and field."""


def normalize_task(record: dict[str, Any], where: str = "task") -> dict[str, Any]:
    """Check one record and return it in canonical form (lists decoded, defaults filled)."""
    if not isinstance(record, dict):
        raise TaskError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [k for k in REQUIRED if not record.get(k)]
    if missing:
        raise TaskError(f"{where}: missing required field(s) {missing}")
    task = dict(record)
    for key in LIST_FIELDS:
        value = task.get(key, [])
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else []
            except json.JSONDecodeError:
                raise TaskError(f"{where}: field {key} is a string but not a JSON list: {value[:80]!r}") from None
        if hasattr(value, "tolist"):  # numpy arrays from parquet
            value = value.tolist()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TaskError(f"{where}: field {key} must be a list of pytest node ids")
        task[key] = value
    if not task["FAIL_TO_PASS"]:
        raise TaskError(f"{where}: FAIL_TO_PASS is empty; a task needs at least one failing test")
    for key in ("repo", "base_commit", "test_patch", "image", "source", "bug_patch"):
        value = task.get(key) or ""
        if not isinstance(value, str):
            raise TaskError(f"{where}: field {key} must be a string")
        task[key] = value
    setup = task.get("environment_setup") or {}
    if isinstance(setup, str):
        setup = json.loads(setup) if setup.strip() else {}
    if not isinstance(setup, dict):
        raise TaskError(f"{where}: environment_setup must be an object")
    unknown = set(setup) - SETUP_KEYS
    if unknown:
        raise TaskError(f"{where}: unknown environment_setup key(s) {sorted(unknown)}; allowed: {sorted(SETUP_KEYS)}")
    task["environment_setup"] = setup
    source = task["source"]
    if source and not source.startswith(("data:", "file:", "pip:")):
        raise TaskError(f"{where}: source {source!r} must start with 'data:', 'file:' or 'pip:'")
    task["id"] = task["instance_id"]
    return task


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    """Load SWE-bench-style tasks from a .jsonl, .json or .parquet file."""
    path = Path(path)
    if not path.exists():
        raise TaskError(f"task file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        records = _read_parquet(path)
    elif suffix == ".jsonl":
        records = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TaskError(f"{path}:{n}: not valid JSON: {e}") from None
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise TaskError(f"{path}: not valid JSON: {e}") from None
        records = data if isinstance(data, list) else [data]
    else:
        raise TaskError(f"{path}: unsupported task file type {suffix!r}; use .jsonl, .json or .parquet")
    tasks = [normalize_task(r, f"{path}:{i + 1}") for i, r in enumerate(records)]
    seen: set[str] = set()
    for t in tasks:
        if t["instance_id"] in seen:
            raise TaskError(f"{path}: duplicate instance_id {t['instance_id']!r}")
        seen.add(t["instance_id"])
    return tasks


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskError(f"{path}: reading parquet needs pyarrow; install it with: pip install pyarrow") from None
    return pq.read_table(path).to_pylist()


def save_tasks(tasks: list[dict[str, Any]], path: str | Path) -> None:
    """Write tasks as JSONL (the format `load_tasks` and SWE-bench tools read)."""
    with open(path, "w") as f:
        for t in tasks:
            f.write(json.dumps({k: v for k, v in t.items() if k != "id"}, ensure_ascii=False) + "\n")


def builtin_tasks() -> list[dict[str, Any]]:
    """The synthesised tasks shipped in envs/swe/data/*.jsonl, sorted by instance_id."""
    tasks = [t for f in sorted(DATA_DIR.glob("*.jsonl")) for t in load_tasks(f)]
    return sorted(tasks, key=lambda t: t["instance_id"])


def resolve_source(task: dict[str, Any], cache_dir: Path | None = None) -> Path | None:
    """Host path of the task's source archive (downloading a pip sdist on first use), or None
    when the repo is already inside the image."""
    source = task.get("source", "")
    if not source:
        return None
    kind, _, ref = source.partition(":")
    if kind == "data":
        path = DATA_DIR / ref
    elif kind == "file":
        path = Path(ref).expanduser()
    else:
        from .synth import fetch_sdist  # pip download only when asked

        path = fetch_sdist(ref, cache_dir or Path("~/.cache/agentrl/swe/sdists").expanduser())
    if not path.exists():
        raise TaskError(f"task {task.get('instance_id')}: source archive {path} not found")
    return path
