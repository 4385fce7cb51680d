"""AST bug injection (envs/swe/mutate.py): each operator, no-op filtering, and gold patches that
apply with the real `git apply` and `patch -p1`."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl.envs.swe.mutate import OPERATORS, find_mutations, sample_mutations, unified_diff

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


def test_every_mutation_parses_and_changes_the_ast() -> None:
    mutations = find_mutations(SOURCE, "pkg/mod.py")
    assert {m.operator for m in mutations} == set(OPERATORS)
    original = ast.dump(ast.parse(SOURCE))
    for m in mutations:
        assert ast.dump(ast.parse(m.mutated)) != original, m.description
        assert len(lines_changed(SOURCE, m.mutated)) <= 2 or m.operator == "dropped_condition"


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
