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

import gzip
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from .datasets import to_agentrl
from .source import fetch_sdist

DATA_DIR = Path(__file__).resolve().parent / "data"
SUITE_DIR = DATA_DIR / "suite"
TASK_SETS = ("core", "suite", "all")
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
    kind, _, ref = source.partition(":")
    if kind in ("data", "file") and not (DATA_DIR / ref if kind == "data" else Path(ref).expanduser()).exists():
        raise TaskError(f"{where}: source archive {ref} not found"
                        + (f" in {DATA_DIR}" if kind == "data" else "") + "; synthesise it with `agentrl swe synth`")
    package = setup.get("package", "")
    if package and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$", package):
        raise TaskError(f"{where}: environment_setup.package {package!r} must look like NAME==VERSION")
    task["id"] = task["instance_id"]
    return task


def load_tasks(path: str | Path, problems: list[str] | None = None) -> list[dict[str, Any]]:
    """Load tasks from a .jsonl (optionally .gz), .json or .parquet file in agentrl's schema or a
    published dataset's (SWE-bench, SWE-Gym, SWE-smith: datasets.py).

    A bad record (missing field, invalid JSON, duplicate id) raises TaskError naming the file,
    line and task, unless `problems` is a list: then that one line is appended there, the record
    is skipped and the other tasks still load."""
    path = Path(path)
    if not path.exists():
        raise TaskError(f"task file not found: {path}")
    name = path.name.lower()
    records: list[tuple[str, Any]] = []  # (where, record or TaskError)
    if name.endswith(".parquet"):
        records = [(f"{path}:{i + 1}", r) for i, r in enumerate(_read_parquet(path))]
    elif name.endswith((".jsonl", ".jsonl.gz")):
        text = gzip.decompress(path.read_bytes()).decode() if name.endswith(".gz") else path.read_text()
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append((f"{path}:{n}", json.loads(line)))
                except json.JSONDecodeError as e:
                    records.append((f"{path}:{n}", TaskError(f"{path}:{n}: not valid JSON: {e}")))
    elif name.endswith(".json"):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise TaskError(f"{path}: not valid JSON: {e}") from None
        records = [(f"{path}:{i + 1}", r) for i, r in enumerate(data if isinstance(data, list) else [data])]
    else:
        raise TaskError(f"{path}: unsupported task file type {path.suffix!r}; use .jsonl, .jsonl.gz, .json "
                        "or .parquet")
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    for where, record in records:
        try:
            if isinstance(record, TaskError):
                raise record
            if isinstance(record, dict) and record.get("instance_id"):
                where = f"{where} task {record['instance_id']}"
            task = normalize_task(to_agentrl(record) if isinstance(record, dict) else record, where)
            if task["instance_id"] in seen:
                raise TaskError(f"{where}: duplicate instance_id {task['instance_id']!r}")
        except TaskError as e:
            if problems is None:
                raise
            problems.append(str(e))
            continue
        seen.add(task["instance_id"])
        tasks.append(task)
    return tasks


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq  # optional: only parquet files need it
    except ImportError:
        raise TaskError(f"{path}: reading parquet needs pyarrow; install it with: pip install pyarrow") from None
    return pq.read_table(path).to_pylist()


def save_tasks(tasks: list[dict[str, Any]], path: str | Path) -> None:
    """Write tasks as JSONL (the format `load_tasks` and SWE-bench tools read), gzipped if the
    name ends in .gz (PASS_TO_PASS lists compress about 20x)."""
    text = "".join(json.dumps({k: v for k, v in t.items() if k != "id"}, ensure_ascii=False) + "\n" for t in tasks)
    if str(path).endswith(".gz"):
        Path(path).write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        Path(path).write_text(text)


def builtin_tasks(which: str = "core") -> list[dict[str, Any]]:
    """The synthesised tasks shipped with agentrl, sorted by instance_id: `core` (envs/swe/data/,
    the default: small enough to validate at every start), `suite` (envs/swe/data/suite/, many
    packages split by package) or `all`."""
    if which not in TASK_SETS:
        raise TaskError(f"unknown shipped task set {which!r}; choose one of {TASK_SETS} or give a task file")
    dirs = {"core": [DATA_DIR], "suite": [SUITE_DIR], "all": [DATA_DIR, SUITE_DIR]}[which]
    files = sorted(f for d in dirs for pattern in ("*.jsonl", "*.jsonl.gz") for f in d.glob(pattern))
    tasks = [t for f in files for t in load_tasks(f)]
    return sorted(tasks, key=lambda t: t["instance_id"])


def resolve_tasks(task_file: str | None, problems: list[str] | None = None) -> list[dict[str, Any]]:
    """A shipped task set by name (None = core), else the tasks of a file."""
    if task_file is None or task_file in TASK_SETS:
        return builtin_tasks(task_file or "core")
    return load_tasks(task_file, problems)


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
        path = fetch_sdist(ref, cache_dir or Path("~/.cache/agentrl/swe/sdists").expanduser())
    if not path.exists():
        raise TaskError(f"task {task.get('instance_id')}: source archive {path} not found")
    return path


def task_split(task: dict[str, Any]) -> str:
    """The task's `split` (the suite splits by package: test packages are never trained on), else
    a stable per-task split: about one task in five is held out for test."""
    if task.get("split"):
        return str(task["split"])
    return "test" if int(hashlib.sha256(task["instance_id"].encode()).hexdigest(), 16) % 5 == 0 else "train"
