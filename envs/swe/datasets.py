"""Instance records of published SWE datasets, mapped onto agentrl's task schema (schema.py).

    SWE-bench / SWE-Gym   repo, instance_id, base_commit, patch (the fix), test_patch,
                          problem_statement, hints_text, created_at, version,
                          FAIL_TO_PASS / PASS_TO_PASS (JSON strings in SWE-bench, lists in
                          SWE-Gym and SWE-bench-extra), environment_setup_commit
    SWE-smith             instance_id, repo, patch (the BUG: the diff that injects it),
                          FAIL_TO_PASS / PASS_TO_PASS (lists), image_name, problem_statement

What agentrl can run: the repository must be on this machine. Neither format ships the source;
SWE-bench's instance images (`sweb.eval.x86_64.<id>`) and SWE-smith's `image_name` hold the repo
at /testbed, so such a task runs on the docker backend when that image is present locally
(agentrl never pulls or clones at run time). `requirements(task)` says so in one line; on the
local backend these tasks are rejected with that line instead of failing mid-episode.
"""

from __future__ import annotations

import re
from typing import Any

SWE_BENCH_KEYS = frozenset({"environment_setup_commit", "hints_text", "version", "created_at"})
TESTBED = "/testbed"


def detect(record: dict[str, Any]) -> str:
    """'agentrl' (ours: has `source` or `environment_setup`), 'swe-smith' (has `image_name`),
    'swe-bench' (SWE-bench / SWE-Gym fields) or 'unknown'."""
    if "source" in record or "environment_setup" in record or "bug_patch" in record:
        return "agentrl"
    if "image_name" in record:
        return "swe-smith"
    if "base_commit" in record and SWE_BENCH_KEYS & set(record):
        return "swe-bench"
    return "unknown"


def swe_bench_image(instance_id: str) -> str:
    """SWE-bench's instance image name (its harness writes `__` as `_1776_` in image names)."""
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_').lower()}:latest"


def to_agentrl(record: dict[str, Any]) -> dict[str, Any]:
    """A record of any supported format, as an agentrl task record (not yet normalised)."""
    kind = detect(record)
    if kind == "swe-bench":
        task = dict(record)
        task.setdefault("image", swe_bench_image(str(record.get("instance_id", ""))))
        task["environment_setup"] = {"repo_dir": TESTBED}
        task["dataset_format"] = "swe-bench"
        return task
    if kind == "swe-smith":
        task = {k: v for k, v in record.items() if k != "image_name"}
        bug = str(record.get("patch") or "")
        task.update(image=record["image_name"], bug_patch=bug, patch=reverse_patch(bug) if bug else "",
                    base_commit=str(record.get("base_commit") or ""), test_patch="",
                    environment_setup={"repo_dir": TESTBED}, dataset_format="swe-smith")
        return task
    return record


def requirements(task: dict[str, Any], backend: str) -> str:
    """'' if agentrl can run `task` on `backend`, else one line saying what it needs."""
    if task.get("source"):
        return ""
    image = task.get("image") or ""
    if backend != "docker":
        return (f"the repository {task.get('repo') or '?'} is not shipped with the task (a "
                f"{task.get('dataset_format', 'dataset')} record needs a network clone at "
                f"{task.get('base_commit') or 'its commit'}); run it with sandbox.backend=docker and the "
                f"image {image or '?'} present locally")
    return "" if image else "no source archive and no image: nothing to put in the sandbox"


# ---------------------------------------------------------------------------------------------
# Reversing a unified diff (SWE-smith's `patch` injects the bug; the gold fix is its reverse)
# ---------------------------------------------------------------------------------------------

_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")


def reverse_patch(patch: str) -> str:
    """The unified diff that undoes `patch`: old and new swapped in headers, hunks and lines."""
    out: list[str] = []
    lines = patch.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        body = line.rstrip("\n")
        m = _HUNK.match(body)
        if body.startswith("diff --git "):
            parts = body.split(" ")
            out.append(" ".join([*parts[:2], *reversed(parts[2:4])]) + "\n" if len(parts) == 4 else line)
        elif body.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = body[4:], lines[i + 1].rstrip("\n")[4:]
            out += [f"--- {_swap_prefix(new)}\n", f"+++ {_swap_prefix(old)}\n"]
            i += 1
        elif body.startswith(("new file mode", "deleted file mode")):
            out.append(line.replace("new file", "\0").replace("deleted file", "new file").replace("\0", "deleted file"))
        elif m:
            out.append(f"@@ -{m.group(2)} +{m.group(1)} @@{m.group(3)}\n")
            i = _reverse_hunk_body(lines, i + 1, out)
            continue
        elif body.startswith("index "):
            a, _, rest = body[6:].partition("..")
            b, _, mode = rest.partition(" ")
            out.append(f"index {b}..{a}{' ' + mode if mode else ''}\n")
        else:
            out.append(line)
        i += 1
    return "".join(out)


def _swap_prefix(name: str) -> str:
    if name.startswith("a/"):
        return "b/" + name[2:]
    if name.startswith("b/"):
        return "a/" + name[2:]
    return name


def _reverse_hunk_body(lines: list[str], i: int, out: list[str]) -> int:
    """Swap `-`/`+` lines of one hunk; a run of removals and additions keeps its block order
    (additions of the reverse first), which `git apply` expects."""
    minus: list[str] = []
    plus: list[str] = []

    def flush() -> None:
        out.extend(plus)  # former additions are now removals and come first
        out.extend(minus)
        minus.clear()
        plus.clear()

    while i < len(lines) and not lines[i].startswith(("@@", "diff --git ")):
        line = lines[i]
        if line.startswith("-") and not line.startswith("--- "):
            minus.append("+" + line[1:])
            _carry_marker(lines, i, minus)
        elif line.startswith("+") and not line.startswith("+++ "):
            plus.append("-" + line[1:])
            _carry_marker(lines, i, plus)
        elif line.startswith("\\"):
            pass  # carried with the line it belongs to
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            break  # next file of a plain `diff -u` patch
        else:
            flush()
            out.append(line)
        i += 1
    flush()
    return i


def _carry_marker(lines: list[str], i: int, into: list[str]) -> None:
    if i + 1 < len(lines) and lines[i + 1].startswith("\\"):
        into.append(lines[i + 1])
