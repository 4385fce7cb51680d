"""AST bug injection for SWE task synthesis (architecture.md §3, issue 8).

Each operator finds sites in a module's AST and proposes one small, plausible bug. A mutation
rewrites only the source span of the mutated node (or deletes the lines of a dropped guard), so
the gold patch (the reverse diff) stays a few lines long and the rest of the file keeps its
formatting.

Operators:
- `operator_swap`: `+`↔`-`, `*`↔`//`… in arithmetic, `<`↔`<=`, `==`↔`!=`… in comparisons,
  `and`↔`or`.
- `off_by_one`: an integer literal `n` in a subscript, slice, `range(...)` call or comparison
  becomes `n + 1` (or `n - 1` when `n > 0`, alternating by site).
- `dropped_condition`: one operand of an `and`/`or` is dropped, or an early-exit guard
  (`if c: return/raise/continue/break` with no `else`) is deleted.
- `swapped_arguments`: the first two positional arguments of a call are swapped.
- `wrong_return`: `return True`↔`return False`, `return <expr>` → `return None`.
- `removed_branch`: an `else:` branch (of if/for/while/try, not an elif) is deleted.
- `wrong_default`: a constant default argument changes (True↔False, n → n±1, "" ↔ " ").
- `wrong_exception`: `raise ValueError` → `raise TypeError`, `except KeyError` → `except IndexError`…
- `slice_bound`: a non-literal slice bound off by one (`s[:n]` → `s[:n - 1]`, `s[i:]` → `s[i + 1:]`).
- `two_functions` (two_function_mutations): two of the above in different functions of one file.
"""

from __future__ import annotations

import ast
import difflib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

OPERATORS = ("operator_swap", "off_by_one", "dropped_condition", "swapped_arguments", "wrong_return",
             "removed_branch", "wrong_default", "wrong_exception", "slice_bound")

_BINOP_SWAP: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult, ast.Mod: ast.FloorDiv, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
}
_CMP_SWAP: dict[type, type] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


@dataclass(frozen=True)
class Mutation:
    """One injected bug: the file it lives in, where, which operator, and both sources."""

    path: str  # repo-relative, POSIX separators
    operator: str
    lineno: int
    description: str
    original: str
    mutated: str

    @property
    def gold_patch(self) -> str:
        """The fix: the unified diff mutated → original (applies with `git apply` / `patch -p1`)."""
        return unified_diff(self.path, self.mutated, self.original)

    @property
    def bug_patch(self) -> str:
        """The bug: the unified diff original → mutated."""
        return unified_diff(self.path, self.original, self.mutated)


def unified_diff(path: str, before: str, after: str) -> str:
    """A git-style unified diff of one file, with `a/` and `b/` prefixes and no-newline markers."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    lines = []
    for line in difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3):
        if not line.endswith("\n"):  # last line of a file without a trailing newline
            line += "\n\\ No newline at end of file\n"
        lines.append(line)
    if not lines:
        return ""
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


# ---------------------------------------------------------------------------------------------
# Source-span editing
# ---------------------------------------------------------------------------------------------


def _line_offsets(source: str) -> list[int]:
    offsets, pos = [0], 0
    for line in source.splitlines(keepends=True):
        pos += len(line)
        offsets.append(pos)
    return offsets


def _replace_span(source: str, node: ast.AST, text: str) -> str:
    """Replace the exact source span of `node` (col offsets are UTF-8 byte offsets)."""
    lines = source.splitlines(keepends=True)
    offsets = _line_offsets(source)

    def pos(lineno: int, col: int) -> int:
        line = lines[lineno - 1].encode("utf-8")
        return offsets[lineno - 1] + len(line[:col].decode("utf-8"))

    start = pos(node.lineno, node.col_offset)  # type: ignore[attr-defined]
    end = pos(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
    return source[:start] + text + source[end:]


def _delete_lines(source: str, first: int, last: int) -> str:
    lines = source.splitlines(keepends=True)
    return "".join(lines[: first - 1] + lines[last:])


def _replace_expr(source: str, node: ast.expr, new: ast.expr) -> str:
    """Replace `node` by `new`, adding parentheses only where precedence needs them."""
    text = ast.unparse(new)
    wrapped = _replace_span(source, node, f"({text})")
    bare = _replace_span(source, node, text)
    try:
        return bare if ast.dump(ast.parse(bare)) == ast.dump(ast.parse(wrapped)) else wrapped
    except SyntaxError:
        return wrapped


# ---------------------------------------------------------------------------------------------
# Operators: each yields (node, lineno, description, new_source) candidates
# ---------------------------------------------------------------------------------------------

Candidate = tuple[int, str, str]  # lineno, description, mutated source


def _operator_swap(tree: ast.Module, source: str) -> Iterator[Candidate]:
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
            if isinstance(node.op, ast.Add) and _is_str_concat(node):
                continue  # "a" - "b" only raises TypeError: not a plausible bug
            new = ast.BinOp(node.left, _BINOP_SWAP[type(node.op)](), node.right)
            yield node.lineno, f"swap {type(node.op).__name__} -> {type(new.op).__name__}", \
                _replace_expr(source, node, new)
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _CMP_SWAP:
                    ops = list(node.ops)
                    ops[i] = _CMP_SWAP[type(op)]()
                    new = ast.Compare(node.left, ops, node.comparators)
                    yield node.lineno, f"swap {type(op).__name__} -> {type(ops[i]).__name__}", \
                        _replace_expr(source, node, new)
        elif isinstance(node, ast.BoolOp):
            other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            yield node.lineno, f"swap {type(node.op).__name__} -> {type(other).__name__}", \
                _replace_expr(source, node, ast.BoolOp(other, node.values))


def _is_str_concat(node: ast.BinOp) -> bool:
    return any(isinstance(s, (ast.JoinedStr, ast.Constant)) and isinstance(getattr(s, "value", ""), str)
               for s in (node.left, node.right))


def _int_sites(tree: ast.Module) -> Iterator[ast.Constant]:
    """Integer literals where an off-by-one is a classic bug: indices, slices, range(), comparisons."""
    for node in ast.walk(tree):
        children: list[ast.AST] = []
        if isinstance(node, ast.Subscript):
            children = [node.slice]
        elif isinstance(node, ast.Slice):
            children = [c for c in (node.lower, node.upper, node.step) if c is not None]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            children = list(node.args)
        elif isinstance(node, ast.Compare):
            children = [node.left, *node.comparators]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            children = [node.right]
        for child in children:
            if isinstance(child, ast.UnaryOp) and isinstance(child.op, ast.USub):
                child = child.operand
            if isinstance(child, ast.Constant) and type(child.value) is int:
                yield child


def _off_by_one(tree: ast.Module, source: str) -> Iterator[Candidate]:
    seen: set[tuple[int, int]] = set()
    for i, node in enumerate(_int_sites(tree)):
        key = (node.lineno, node.col_offset)
        if key in seen:
            continue
        seen.add(key)
        value = node.value + (1 if i % 2 == 0 or node.value == 0 else -1)
        yield node.lineno, f"off by one: {node.value} -> {value}", _replace_span(source, node, str(value))


def _dropped_condition(tree: ast.Module, source: str) -> Iterator[Candidate]:
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp):
            for i in range(len(node.values)):
                rest = node.values[:i] + node.values[i + 1:]
                new: ast.expr = rest[0] if len(rest) == 1 else ast.BoolOp(node.op, rest)
                yield node.lineno, f"drop operand {i} of {type(node.op).__name__}", \
                    _replace_expr(source, node, new)
        for body in _blocks(node):
            if len(body) < 2:
                continue  # deleting the only statement would leave an empty block
            for stmt in body:
                if (isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1
                        and isinstance(stmt.body[0], _EXITS)):
                    yield stmt.lineno, "drop guard clause", \
                        _delete_lines(source, stmt.lineno, stmt.end_lineno or stmt.lineno)


def _blocks(node: ast.AST) -> Iterator[list[ast.stmt]]:
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block


def _swapped_arguments(tree: ast.Module, source: str) -> Iterator[Candidate]:
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and len(node.args) >= 2
                and not any(isinstance(a, ast.Starred) for a in node.args[:2])
                and ast.dump(node.args[0]) != ast.dump(node.args[1])):
            args = [node.args[1], node.args[0], *node.args[2:]]
            new = ast.Call(node.func, args, node.keywords)
            yield node.lineno, f"swap arguments of {ast.unparse(node.func)}()", \
                _replace_expr(source, node, new)


def _wrong_return(tree: ast.Module, source: str) -> Iterator[Candidate]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        value = node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, bool):
            text = f"return {not value.value}"
        elif isinstance(value, ast.Constant) and value.value is None:
            continue
        else:
            text = "return None"
        yield node.lineno, f"wrong return: {text}", _replace_span(source, node, text)


_EXCEPTION_SWAP = {"ValueError": "TypeError", "TypeError": "ValueError", "KeyError": "IndexError",
                   "IndexError": "KeyError", "AttributeError": "KeyError", "RuntimeError": "ValueError",
                   "NotImplementedError": "RuntimeError", "LookupError": "ValueError"}


def _removed_branch(tree: ast.Module, source: str) -> Iterator[Candidate]:
    """An `else:` branch (not an `elif`) deleted, so its case falls through to what follows."""
    lines = source.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.If, ast.For, ast.While, ast.Try)) or not node.orelse:
            continue
        first = node.orelse[0]
        if isinstance(node, ast.If) and isinstance(first, ast.If) and lines[first.lineno - 1].lstrip().startswith("elif"):
            continue
        else_line = first.lineno - 1
        if else_line < 1 or lines[else_line - 1].strip() != "else:":
            continue
        if isinstance(node, ast.If) and not node.body:
            continue
        yield else_line, "remove else branch", _delete_lines(source, else_line, node.orelse[-1].end_lineno or else_line)


def _wrong_default(tree: ast.Module, source: str) -> Iterator[Candidate]:
    """A constant default argument changed: True<->False, n -> n+1 (n-1 for n > 1), "" <-> " "."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for default in [*node.args.defaults, *[d for d in node.args.kw_defaults if d is not None]]:
            if not isinstance(default, ast.Constant):
                continue
            value = default.value
            if isinstance(value, bool):
                text = repr(not value)
            elif isinstance(value, int):
                text = str(value - 1 if value > 1 else value + 1)
            elif isinstance(value, str) and len(value) <= 1:
                text = repr(" " if value == "" else "")
            else:
                continue
            yield default.lineno, f"default of {node.name}(): {ast.unparse(default)} -> {text}", \
                _replace_span(source, default, text)


def _wrong_exception(tree: ast.Module, source: str) -> Iterator[Candidate]:
    """`raise ValueError(...)` raises another type, or `except KeyError` catches another one."""
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        elif isinstance(node, ast.ExceptHandler) and node.type is not None:
            target = node.type
        if isinstance(target, ast.Name) and target.id in _EXCEPTION_SWAP:
            new = _EXCEPTION_SWAP[target.id]
            what = "raise" if isinstance(node, ast.Raise) else "except"
            yield target.lineno, f"{what} {target.id} -> {new}", _replace_span(source, target, new)


def _slice_bound(tree: ast.Module, source: str) -> Iterator[Candidate]:
    """A non-literal slice bound off by one: `s[:n]` -> `s[:n - 1]`, `s[i:]` -> `s[i + 1:]`."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Slice):
            continue
        for bound, delta in ((node.lower, ast.Add()), (node.upper, ast.Sub())):
            if bound is None or isinstance(bound, ast.Constant):
                continue  # literal bounds are off_by_one's
            new = ast.BinOp(bound, delta, ast.Constant(1))
            yield bound.lineno, f"slice bound {ast.unparse(bound)} -> {ast.unparse(new)}", \
                _replace_expr(source, bound, new)


def two_function_mutations(mutations: list[Mutation], k: int, seed: int = 0) -> list[Mutation]:
    """Up to `k` bugs spanning two functions of one file: two single-site mutations of different
    top-level functions or methods applied together (operator `two_functions`)."""
    rng = random.Random(seed)
    by_file: dict[str, list[Mutation]] = {}
    for m in mutations:
        by_file.setdefault(m.path, []).append(m)
    out: list[Mutation] = []
    for path, group in sorted(by_file.items()):
        funcs = _function_spans(group[0].original)
        tagged = [(m, f) for m in group if (f := _enclosing(funcs, m.lineno)) is not None]
        rng.shuffle(tagged)
        for (a, fa), (b, fb) in zip(tagged[0::2], tagged[1::2]):
            if fa == fb or len(out) >= k:
                continue
            first, second = sorted((a, b), key=lambda m: m.lineno)
            merged = _merge(first, second)
            if merged is not None:
                out.append(Mutation(path, "two_functions", first.lineno,
                                    f"{first.description} in {fa if first is a else fb}(); "
                                    f"{second.description} in {fb if second is b else fa}()",
                                    first.original, merged))
    return out


def _function_spans(source: str) -> list[tuple[str, int, int]]:
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans.append((node.name, node.lineno, node.end_lineno or node.lineno))
    return spans


def _enclosing(spans: list[tuple[str, int, int]], lineno: int) -> str | None:
    inside = [s for s in spans if s[1] <= lineno <= s[2]]
    return min(inside, key=lambda s: s[2] - s[1])[0] if inside else None  # the innermost function


def _changed_region(original: list[str], mutated: list[str]) -> tuple[int, int, list[str]]:
    """original[a:b] became the returned lines: the span between the common prefix and suffix
    (linear; a single-site mutation changes one contiguous span)."""
    a = 0
    while a < min(len(original), len(mutated)) and original[a] == mutated[a]:
        a += 1
    tail = 0
    while tail < min(len(original), len(mutated)) - a and original[-1 - tail] == mutated[-1 - tail]:
        tail += 1
    return a, len(original) - tail, mutated[a:len(mutated) - tail]


def _merge(first: Mutation, second: Mutation) -> str | None:
    """Both mutations' line changes in one source, if their regions do not overlap."""
    original = first.original.splitlines(keepends=True)
    a1, a2, la = _changed_region(original, first.mutated.splitlines(keepends=True))
    b1, b2, lb = _changed_region(original, second.mutated.splitlines(keepends=True))
    if a2 > b1:
        return None
    merged = "".join(original[:a1] + la + original[a2:b1] + lb + original[b2:])
    try:
        ast.parse(merged)
    except SyntaxError:
        return None
    return merged


_OPERATOR_FNS: dict[str, Callable[[ast.Module, str], Iterator[Candidate]]] = {
    "operator_swap": _operator_swap,
    "off_by_one": _off_by_one,
    "dropped_condition": _dropped_condition,
    "swapped_arguments": _swapped_arguments,
    "wrong_return": _wrong_return,
    "removed_branch": _removed_branch,
    "wrong_default": _wrong_default,
    "wrong_exception": _wrong_exception,
    "slice_bound": _slice_bound,
}


def find_mutations(source: str, path: str, operators: tuple[str, ...] = OPERATORS) -> list[Mutation]:
    """Every valid single-site mutation of `source`, in file order per operator.

    A candidate is kept only if the mutated file still parses and its AST differs from the
    original (no no-op mutations). `if __name__ == "__main__"` blocks are skipped.
    """
    unknown = set(operators) - set(_OPERATOR_FNS)
    if unknown:
        raise ValueError(f"unknown mutation operator(s) {sorted(unknown)}; known: {list(OPERATORS)}")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"{path} does not parse: {e}") from None
    _strip_unmutable(tree)
    original_dump = ast.dump(ast.parse(source))
    out: list[Mutation] = []
    seen: set[str] = set()
    for op in operators:
        for lineno, description, mutated in _OPERATOR_FNS[op](tree, source):
            if mutated in seen:
                continue
            seen.add(mutated)
            try:
                if ast.dump(ast.parse(mutated)) == original_dump:
                    continue
            except SyntaxError:
                continue
            out.append(Mutation(path, op, lineno, description, source, mutated))
    return out


def _strip_unmutable(tree: ast.Module) -> None:
    """Remove `if __name__ == "__main__":` blocks: tests never run them."""
    tree.body = [s for s in tree.body if not (isinstance(s, ast.If) and "__name__" in ast.unparse(s.test))]


def sample_mutations(mutations: list[Mutation], k: int, seed: int = 0) -> list[Mutation]:
    """Up to `k` mutations, round-robin over operators so every kind of bug is represented."""
    rng = random.Random(seed)
    by_op: dict[str, list[Mutation]] = {}
    for m in mutations:
        by_op.setdefault(m.operator, []).append(m)
    for group in by_op.values():
        rng.shuffle(group)
    order = sorted(by_op)
    out: list[Mutation] = []
    while len(out) < k and any(by_op.values()):
        for op in order:
            if by_op[op] and len(out) < k:
                out.append(by_op[op].pop())
    return out
