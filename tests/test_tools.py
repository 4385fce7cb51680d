"""@tool schemas, argument validation, failure modes, truncation, and the built-in tools against
the real bubblewrap sandbox."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from typing import Any, Literal, Optional

import pytest

from agentrl.tools import (
    ArgumentError,
    ToolResult,
    bash,
    python,
    search,
    str_replace_editor,
    submit,
    tool,
    truncate,
)
from agentrl.tools.docstring import parse_docstring
from agentrl.tools.schema import coerce, json_schema

# ---------------------------------------------------------------------------------------------
# schema from type hints
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("hint", "schema"), [
    (str, {"type": "string"}),
    (int, {"type": "integer"}),
    (float, {"type": "number"}),
    (bool, {"type": "boolean"}),
    (list[int], {"type": "array", "items": {"type": "integer"}}),
    (list[list[str]], {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}),
    (list, {"type": "array"}),
    (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
    (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
    (Literal[1, 2, 3], {"type": "integer", "enum": [1, 2, 3]}),
    (Optional[int], {"type": ["integer", "null"]}),  # noqa: UP045 - the Optional spelling on purpose
    (int | None, {"type": ["integer", "null"]}),
    (list[int] | None, {"type": ["array", "null"], "items": {"type": "integer"}}),
    (Literal["x"] | None, {"type": ["string", "null"], "enum": ["x"]}),
    (Any, {}),
])
def test_schema_of_each_type(hint: Any, schema: dict[str, Any]) -> None:
    assert json_schema(hint) == schema


@pytest.mark.parametrize("hint", [set[int], tuple[int, int], dict[int, str], Literal["a", 1], int | str, object])
def test_unsupported_hints_are_refused(hint: Any) -> None:
    with pytest.raises(TypeError, match=r"supported|Literal|dict keys"):
        json_schema(hint)


def test_tool_schema_required_defaults_and_hidden_injections() -> None:
    @tool(inject=("sandbox", "state"))
    def f(a: int, b: str = "x", c: float | None = None, sandbox: Any = None, state: Any = None) -> str:
        """Do f."""
        return ""

    params = f.parameters
    assert list(params["properties"]) == ["a", "b", "c"]  # sandbox/state hidden from the model
    assert params["required"] == ["a"]
    assert params["properties"]["b"] == {"type": "string", "default": "x"}
    assert params["properties"]["c"] == {"type": ["number", "null"], "default": None}
    assert f.spec() == {"type": "function", "function": {"name": "f", "description": "Do f.", "parameters": params}}


def test_tool_definition_errors_name_the_problem() -> None:
    def no_hint(a):  # type: ignore[no-untyped-def]
        return a

    with pytest.raises(TypeError, match=r"parameter 'a' needs a type hint"):
        tool(no_hint)

    def bad_type(a: set[int]) -> str:
        return ""

    with pytest.raises(TypeError, match=r"parameter 'a'"):
        tool(bad_type)

    def fine(a: int) -> str:
        return ""

    with pytest.raises(TypeError, match=r"inject names 'sandbox'"):
        tool(inject=("sandbox",))(fine)

    def star(*args: int) -> str:
        return ""

    with pytest.raises(TypeError, match=r"plain named parameter"):
        tool(star)


# ---------------------------------------------------------------------------------------------
# docstring styles
# ---------------------------------------------------------------------------------------------

GOOGLE = """Add two numbers.

    A longer explanation that is part of the summary.

    Args:
        a (int): the first
            number
        b: the second number

    Returns:
        str: the sum
    """

NUMPY = """Add two numbers.

    Parameters
    ----------
    a : int
        the first
        number
    b : int, optional
        the second number

    Returns
    -------
    str
        the sum
    """

SPHINX = """Add two numbers.

    :param a: the first
        number
    :param int b: the second number
    :returns: the sum
    :rtype: str
    """


@pytest.mark.parametrize(("doc", "summary"), [
    (GOOGLE, "Add two numbers. A longer explanation that is part of the summary."),
    (NUMPY, "Add two numbers."),
    (SPHINX, "Add two numbers."),
])
def test_docstring_styles(doc: str, summary: str) -> None:
    description, params = parse_docstring(doc)
    assert description == summary
    assert params == {"a": "the first number", "b": "the second number"}


def test_docstring_descriptions_reach_the_schema() -> None:
    def add(a: int, b: int) -> str:
        return str(a + b)

    for doc in (GOOGLE, NUMPY, SPHINX):
        add.__doc__ = doc
        t = tool(add)
        assert t.parameters["properties"]["a"]["description"] == "the first number"
        assert t.parameters["properties"]["b"]["description"] == "the second number"
        assert t.description.startswith("Add two numbers.")
    assert parse_docstring(None) == ("", {})


# ---------------------------------------------------------------------------------------------
# calling: validation, coercion and failures become ToolResult.error
# ---------------------------------------------------------------------------------------------


@tool
def typed(n: int, x: float, flag: bool, items: list[int], mode: Literal["a", "b"] = "a",
          maybe: int | None = None) -> dict[str, Any]:
    """Echo typed arguments."""
    return {"n": n, "x": x, "flag": flag, "items": items, "mode": mode, "maybe": maybe}


async def test_coercion_of_string_arguments() -> None:
    # The XML format carries only strings; the declared types decide.
    result = await typed.call({"n": "3", "x": "2.5", "flag": "true", "items": "[1, 2]", "mode": "b", "maybe": "null"})
    assert result == ToolResult('{"n": 3, "x": 2.5, "flag": true, "items": [1, 2], "mode": "b", "maybe": null}')
    result = await typed.call({"n": 3.0, "x": 1, "flag": False, "items": []})
    assert result.ok and '"n": 3,' in result.output and '"x": 1.0' in result.output


@pytest.mark.parametrize(("args", "message"), [
    ({"n": "three", "x": 1, "flag": True, "items": []}, "argument 'n' must be integer, got str 'three'"),
    ({"n": 1, "x": "abc", "flag": True, "items": []}, "argument 'x' must be number"),
    ({"n": 1, "x": 1, "flag": "yes", "items": []}, "argument 'flag' must be boolean"),
    ({"n": 1, "x": 1, "flag": True, "items": [1, "z"]}, "argument 'items[1]' must be integer"),
    ({"n": 1, "x": 1, "flag": True, "items": []," mode": "a"}, "has no argument ' mode'"),
    ({"n": 1, "x": 1, "flag": True, "items": [], "mode": "c"}, "argument 'mode' must be one of \"a\", \"b\""),
    ({"n": True, "x": 1, "flag": True, "items": []}, "argument 'n' must be integer, got bool"),
    ({"x": 1, "flag": True, "items": []}, "missing required argument 'n'"),
    (["not", "a", "dict"], "takes a JSON object of arguments"),
])
async def test_wrong_arguments_become_readable_errors(args: Any, message: str) -> None:
    result = await typed.call(args)
    assert not result.ok and message in result.error


def test_coerce_is_strict_about_strings() -> None:
    assert coerce("7", int, "k") == 7
    with pytest.raises(ArgumentError, match=r"argument 'k' must be string"):
        coerce(7, str, "k")
    with pytest.raises(ArgumentError):
        coerce(2.5, int, "k")


async def test_a_tool_that_raises_becomes_an_error() -> None:
    @tool
    def boom(a: int) -> str:
        """Fail."""
        raise ZeroDivisionError("no luck")

    result = await boom.call({"a": 1})
    assert result.error == "tool 'boom' raised ZeroDivisionError: no luck"


async def test_timeouts_sync_and_async() -> None:
    @tool(timeout=0.2)
    async def slow_async() -> str:
        """Sleep."""
        await asyncio.sleep(5)
        return "done"

    @tool
    def slow_sync(seconds: float) -> str:
        """Sleep in a thread."""
        time.sleep(seconds)
        return "done"

    start = time.perf_counter()
    assert (await slow_async.call({})).error == "tool 'slow_async' timed out after 0.2 s"
    assert (await slow_sync.call({"seconds": 0.6}, timeout=0.1)).error == "tool 'slow_sync' timed out after 0.1 s"
    assert time.perf_counter() - start < 2.0
    assert (await slow_sync.call({"seconds": 0.0}, timeout=1)).output == "done"


async def test_sync_tools_run_off_the_event_loop() -> None:
    @tool
    def where() -> str:
        """Report the thread."""
        return threading.current_thread().name

    assert (await where.call({})).output != threading.current_thread().name


async def test_missing_injection_is_a_wiring_error_not_an_observation() -> None:
    with pytest.raises(TypeError, match=r"needs injected state"):
        await submit.call({"answer": "x"})


async def test_submit_records_the_answer_in_dict_or_object_state() -> None:
    state: dict[str, Any] = {}
    assert (await submit.call({"answer": "42"}, state=state)).output == "Submitted."
    assert state == {"answer": "42", "submitted": True}

    class State:
        answer = None

    obj = State()
    await submit.call({}, state=obj)
    assert obj.answer == "" and obj.submitted is True  # type: ignore[attr-defined]
    assert submit.terminal


# ---------------------------------------------------------------------------------------------
# truncation
# ---------------------------------------------------------------------------------------------


def test_truncate_keeps_head_and_tail_with_a_marker() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    out = truncate(text, 90)
    assert out.startswith(text[:60]) and out.endswith(text[-30:])
    assert "[... truncated 910 chars ...]" in out
    assert truncate("short", 90) == "short"
    assert "[... truncated 5 chars ...]" in truncate("abcde", 0)
    with pytest.raises(ValueError, match=r"limit"):
        truncate("x", -1)


# ---------------------------------------------------------------------------------------------
# search (with a small real retriever object; the search env supplies BM25)
# ---------------------------------------------------------------------------------------------


class KeywordRetriever:
    """Ranks documents by how many query words they contain."""

    def __init__(self, docs: dict[str, str]) -> None:
        self.docs = docs

    def search(self, query: str, k: int) -> list[dict[str, str]]:
        words = query.lower().split()
        scored = sorted(self.docs.items(), key=lambda kv: -sum(w in kv[1].lower() for w in words))
        return [{"id": i, "title": i.title(), "text": t} for i, t in scored[:k] if any(w in t.lower() for w in words)]


async def test_search_tool_formats_hits_and_checks_k() -> None:
    retriever = KeywordRetriever({"france": "Paris is the capital of France.", "peru": "Lima is the capital of Peru."})
    out = await search.call({"query": "capital Peru", "k": 1}, retriever=retriever)
    assert out.output == "[1] id=peru Peru\nLima is the capital of Peru."
    assert (await search.call({"query": "zzz"}, retriever=retriever)).output == "No results."
    assert "between 1 and 20" in (await search.call({"query": "x", "k": 0}, retriever=retriever)).error
    assert "retriever" not in search.parameters["properties"]


# ---------------------------------------------------------------------------------------------
# the built-in sandbox tools against the real bubblewrap sandbox
# ---------------------------------------------------------------------------------------------

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture
async def sandbox() -> Any:
    from agentrl.sandboxes import make_sandbox

    sb = make_sandbox()
    yield sb
    await sb.close()


@needs_bwrap
async def test_python_and_bash_in_bwrap(sandbox: Any) -> None:
    out = await python.call({"code": "import sys\nprint(6 * 7)\nprint('oops', file=sys.stderr)"}, sandbox=sandbox,
                            timeout=10)
    assert out == ToolResult("42\noops")
    out = await python.call({"code": "raise SystemExit(3)"}, sandbox=sandbox, timeout=10)
    assert out.ok and out.output.endswith("[exit code 3]")  # a failing program is a result, not a tool error
    out = await bash.call({"command": "echo hi > f.txt && cat f.txt && pwd"}, sandbox=sandbox, timeout=10)
    assert out.output == "hi\n/work"
    assert (await sandbox.read_file("f.txt")) == b"hi\n"
    out = await bash.call({"command": "true"}, sandbox=sandbox, timeout=10)
    assert out.output == "(no output)"


@needs_bwrap
async def test_sandbox_tool_timeout_kills_the_process(sandbox: Any) -> None:
    start = time.perf_counter()
    out = await bash.call({"command": "echo started; sleep 30"}, sandbox=sandbox, timeout=0.5)
    assert out.error == "sandbox fault (timeout): timed out after 0.5 s; the process was killed" and out.fault == "timeout"
    assert time.perf_counter() - start < 5


@needs_bwrap
async def test_editor_commands_in_bwrap(sandbox: Any) -> None:
    state: dict[str, Any] = {}

    async def edit(**args: Any) -> ToolResult:
        return await str_replace_editor.call(args, sandbox=sandbox, state=state, timeout=10)

    assert (await edit(command="create", path="pkg/m.py", file_text="a = 1\nb = 2\n")).output == "Created pkg/m.py."
    assert "already exists" in (await edit(command="create", path="pkg/m.py", file_text="")).error
    view = await edit(command="view", path="pkg/m.py")
    assert view.output == "     1\ta = 1\n     2\tb = 2\n     3\t"
    assert (await edit(command="view", path="pkg/m.py", view_range=[2, 2])).output == "     2\tb = 2"
    assert "outside the file's lines" in (await edit(command="view", path="pkg/m.py", view_range=[5, 9])).error
    listing = await edit(command="view", path=".")
    assert "./pkg/m.py" in listing.output

    out = await edit(command="str_replace", path="pkg/m.py", old_str="b = 2", new_str="b = 20")
    assert out.ok and "b = 20" in out.output
    assert await sandbox.read_file("pkg/m.py") == b"a = 1\nb = 20\n"
    assert "not found" in (await edit(command="str_replace", path="pkg/m.py", old_str="zzz", new_str="")).error
    await edit(command="insert", path="pkg/m.py", insert_line=0, new_str="# top")
    await edit(command="insert", path="pkg/m.py", insert_line=1, new_str="a = 1")
    dup = await edit(command="str_replace", path="pkg/m.py", old_str="a = 1", new_str="")
    assert "occurs 2 times" in dup.error and "[2, 3]" in dup.error
    assert "between 0 and" in (await edit(command="insert", path="pkg/m.py", insert_line=99, new_str="x")).error

    # undo walks back edit by edit, then the creation itself
    await edit(command="undo_edit", path="pkg/m.py")
    assert await sandbox.read_file("pkg/m.py") == b"# top\na = 1\nb = 20\n"
    await edit(command="undo_edit", path="pkg/m.py")
    await edit(command="undo_edit", path="pkg/m.py")
    assert await sandbox.read_file("pkg/m.py") == b"a = 1\nb = 2\n"
    assert "gone" in (await edit(command="undo_edit", path="pkg/m.py")).output
    assert "does not exist" in (await edit(command="view", path="pkg/m.py")).error
    assert "no edit of pkg/m.py to undo" in (await edit(command="undo_edit", path="pkg/m.py")).error

    assert "is a directory" in (await edit(command="str_replace", path="pkg", old_str="x", new_str="y")).error
    assert "must be one of" in (await edit(command="delete", path="x")).error
    assert "needs file_text" in (await edit(command="create", path="n.py")).error


# ---------------------------------------------------------------------------------------------
# issue 20: no argument a model can send makes a tool call raise (hypothesis, through real envs)
# ---------------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_NASTY = st.sampled_from(["9" * 5000, "-" + "9" * 5000, "[" * 5000, "{" * 5000, "1e999999", "nan", "null",
                          "\x00", "\udcff", "../../etc/passwd", "/", "", " ", "true", "[1, 2]", '{"a": 1}'])
_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40) | _NASTY)
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                             max_size=3), max_leaves=8)


def _arguments(tool_obj: Any) -> st.SearchStrategy[Any]:
    names = [*tool_obj.hints, "no_such_argument"]
    return (st.dictionaries(st.sampled_from(names), _VALUES, max_size=len(names))
            | _VALUES)  # not even an object, sometimes


def test_int_argument_of_5000_digits_is_an_observation() -> None:
    """The issue's case: Python's int-conversion digit limit must not escape tools/schema.py."""
    with pytest.raises(ArgumentError, match="must be integer"):
        coerce("9" * 5000, int, "k")
    r = asyncio.run(search.call({"query": "x", "k": "9" * 5000}, retriever=None))
    assert not r.ok and "argument 'k' must be integer" in r.error
    r = asyncio.run(search.call({"query": "x", "k": 10**5000}, retriever=None))
    assert not r.ok  # an int too large to print: still only an error message


def _fuzz_env(env: Any, tasks: list[Any]) -> None:
    """Every built-in tool of `env` with hypothesis-made arguments, as the model's tool-call text,
    through the real env: each step must return, never raise."""
    tool_and_args = st.one_of(*[st.tuples(st.just(t), _arguments(t)) for t in env.tools])

    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(tool_and_args)
    def step(case: tuple[Any, Any]) -> None:
        tool_obj, args = case
        env.reset(options={"task": tasks[0]})
        import json

        try:
            payload = json.dumps({"name": tool_obj.name, "arguments": args})
        except ValueError:  # e.g. NaN is fine for json; only a value json cannot write lands here
            return
        obs, reward, *_ = env.step(f"<tool_call>{payload}</tool_call>")
        assert isinstance(obs, list) and obs and all(isinstance(m.get("content"), str) for m in obs)
        assert isinstance(reward, float)

    try:
        step()
    finally:
        env.close()


@pytest.mark.timeout(120)
def test_fuzzed_arguments_never_raise_in_the_search_env() -> None:
    from agentrl.envs.search.env import SearchEnv

    env = SearchEnv()
    _fuzz_env(env, env.tasks("train")[:1])


@pytest.mark.timeout(120)
def test_fuzzed_arguments_never_raise_in_sandbox_envs() -> None:
    """python, bash, str_replace_editor and submit with a real bubblewrap sandbox."""
    from agentrl.config import SandboxConfig
    from agentrl.env import ToolEnv

    class Everything(ToolEnv):
        tools = (python, bash, str_replace_editor, submit)
        needs_sandbox = True
        tool_timeout_s = 5.0

        def tasks(self, split: str = "train") -> list[dict[str, Any]]:
            return [{"id": "0", "prompt": "anything"}]

        async def reward(self, task: dict[str, Any], state: Any) -> float:
            return 0.0

    env = Everything(sandbox_config=SandboxConfig(backend="local", memory_mb=256))
    _fuzz_env(env, env.tasks())


@pytest.mark.timeout(120)
def test_fuzzed_arguments_never_raise_in_the_code_env() -> None:
    from agentrl.config import SandboxConfig
    from agentrl.envs.code import CodeEnv

    env = CodeEnv(num_tasks=1, sandbox_config=SandboxConfig(backend="local", memory_mb=256), test_timeout_s=3)
    _fuzz_env(env, env.tasks("train"))
