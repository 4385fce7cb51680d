"""AST bug injection (envs/swe/mutate.py): each operator, no-op filtering, and gold patches that
apply with the real `git apply` and `patch -p1`."""

from __future__ import annotations

import ast
import difflib
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl.envs.swe.mutate import (
    OPERATORS,
    find_mutations,
    sample_mutations,
    two_function_mutations,
    unified_diff,
)

SOURCE = '''\
def clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:
        return lo
    if x > hi and hi is not None:
        return hi
    return x


def last(items):
    total = len(items) - 1
    return items[total] if items else None


def is_empty(items):
    return len(items) == 0


def span(a, b):
    return range(a, b + 1)


if __name__ == "__main__":
    print(clamp(1, 2, 3))
'''


def by_op(op: str) -> list[str]:
    return [m.mutated for m in find_mutations(SOURCE, "pkg/mod.py", (op,))]


def lines_changed(before: str, after: str) -> list[tuple[str, str]]:
    return [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]


def test_operator_swap() -> None:
    changed = [lines_changed(SOURCE, m) for m in by_op("operator_swap")]
    assert [("    if x < lo:", "    if x <= lo:")] in changed
    assert [("    total = len(items) - 1", "    total = len(items) + 1")] in changed
    assert [("    if x > hi and hi is not None:", "    if x > hi or hi is not None:")] in changed
    assert [("    if x > hi and hi is not None:", "    if x > hi and hi is None:")] in changed


def test_off_by_one() -> None:
    changed = [lines_changed(SOURCE, m) for m in by_op("off_by_one")]
    assert [("    return len(items) == 0", "    return len(items) == 1")] in changed
    assert any(c and c[0][0] == "    return range(a, b + 1)" for c in changed)


def test_dropped_condition() -> None:
    mutated = by_op("dropped_condition")
    assert any(tuple(b for _, b in lines_changed(SOURCE, m)) == ("    if x > hi:", ) for m in mutated)
    # the early-exit guard `if x < lo: return lo` deleted entirely
    assert any("if x < lo" not in m and m.count("\n") == SOURCE.count("\n") - 2 for m in mutated)


def test_swapped_arguments() -> None:
    changed = [lines_changed(SOURCE, m) for m in by_op("swapped_arguments")]
    assert [("    return range(a, b + 1)", "    return range(b + 1, a)")] in changed
    assert all("print(" not in str(c) for c in changed)  # __main__ blocks are never mutated


def test_wrong_return() -> None:
    changed = [lines_changed(SOURCE, m) for m in by_op("wrong_return")]
    assert [("    return x", "    return None")] in changed
    src = "def f():\n    return None\n\ndef g():\n    return True\n"
    out = [m.mutated for m in find_mutations(src, "m.py", ("wrong_return",))]
    assert out == ["def f():\n    return None\n\ndef g():\n    return False\n"]


SOURCE2 = '''\
def head(items, n=3, strict=False):
    if strict and len(items) < n:
        raise ValueError("too few items")
    return items[:n]


def lookup(table, key):
    try:
        value = table[key]
    except KeyError:
        return None
    else:
        return value.strip()
'''


def test_every_mutation_parses_and_changes_the_ast() -> None:
    mutations = find_mutations(SOURCE, "pkg/mod.py") + find_mutations(SOURCE2, "pkg/two.py")
    assert {m.operator for m in mutations} == set(OPERATORS)
    for m in mutations:
        assert ast.dump(ast.parse(m.mutated)) != ast.dump(ast.parse(m.original)), m.description
        assert len(lines_changed(m.original, m.mutated)) <= 2 or m.operator in ("dropped_condition", "removed_branch")


def test_new_bug_kinds() -> None:
    by_op = {}
    for m in find_mutations(SOURCE2, "pkg/two.py"):
        by_op.setdefault(m.operator, []).append(m)
    assert any("def head(items, n=2, strict=False)" in m.mutated for m in by_op["wrong_default"])
    assert any("def head(items, n=3, strict=True)" in m.mutated for m in by_op["wrong_default"])
    assert any("raise TypeError(" in m.mutated for m in by_op["wrong_exception"])
    assert any("except IndexError:" in m.mutated for m in by_op["wrong_exception"])
    assert [m.mutated.count("else:") for m in by_op["removed_branch"]] == [0]
    assert "return items[:n - 1]" in by_op["slice_bound"][0].mutated


def test_two_function_bugs_touch_two_functions(tmp_path: Path) -> None:
    singles = find_mutations(SOURCE, "pkg/mod.py")
    pairs = two_function_mutations(singles, k=5, seed=1)
    assert pairs and all(m.operator == "two_functions" for m in pairs)
    for m in pairs:
        matcher = difflib.SequenceMatcher(None, SOURCE.splitlines(), m.mutated.splitlines(), autojunk=False)
        changed = [n + 1 for tag, i1, i2, _, _ in matcher.get_opcodes() if tag != "equal" for n in range(i1, max(i2, i1 + 1))]
        assert len({_function_of(SOURCE, n) for n in changed}) == 2, (m.description, changed)
        ast.parse(m.mutated)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(pairs[0].mutated)
    (tmp_path / "fix.diff").write_text(pairs[0].gold_patch)
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / "pkg" / "mod.py").read_text() == SOURCE


def _function_of(source: str, lineno: int) -> str:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.lineno <= lineno <= (node.end_lineno or 0):
            return node.name
    return ""


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="does not parse"):
        find_mutations("def f(:\n", "broken.py")
    with pytest.raises(ValueError, match="unknown mutation operator"):
        find_mutations(SOURCE, "m.py", ("flip_bits",))


def test_sample_is_seeded_and_round_robin() -> None:
    mutations = find_mutations(SOURCE, "pkg/mod.py")
    a, b = sample_mutations(mutations, 5, seed=3), sample_mutations(mutations, 5, seed=3)
    assert a == b and len({m.operator for m in a}) == 5


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("patch") is None, reason="needs git and patch")
@pytest.mark.parametrize("tool", ["git", "patch"])
def test_gold_patch_applies_with_real_tools(tmp_path: Path, tool: str) -> None:
    for i, m in enumerate(find_mutations(SOURCE, "pkg/mod.py")[::7]):
        repo = tmp_path / f"r{i}"
        (repo / "pkg").mkdir(parents=True)
        (repo / "pkg/mod.py").write_text(m.mutated)
        (repo / "fix.diff").write_text(m.gold_patch)
        cmd = ["git", "apply", "fix.diff"] if tool == "git" else ["patch", "-p1", "-i", "fix.diff"]
        subprocess.run(cmd, cwd=repo, check=True, capture_output=True)
        assert (repo / "pkg/mod.py").read_text() == SOURCE


def test_unified_diff_marks_missing_final_newline(tmp_path: Path) -> None:
    diff = unified_diff("a.py", "x = 1\n", "x = 2")
    assert "\\ No newline at end of file" in diff
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "d.diff").write_text(diff)
    subprocess.run(["git", "apply", "d.diff"], cwd=tmp_path, check=True, capture_output=True)
    assert (tmp_path / "a.py").read_text() == "x = 2"
