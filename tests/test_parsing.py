"""Tool-call parsers: examples of each format, the never-raises property on arbitrary text, and
format → parse round trips (hypothesis)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.parsing import (
    FencedParser,
    ParseResult,
    ToolCall,
    get_parser,
    list_parsers,
    register_parser,
)
from agentrl.tools import bash, python, str_replace_editor, submit, tool

PARSERS = ["hermes", "fenced", "xml"]

# ---------------------------------------------------------------------------------------------
# hermes
# ---------------------------------------------------------------------------------------------


def test_hermes_calls() -> None:
    p = get_parser("hermes")
    text = ('Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
            '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
            '<tool_call>[{"name": "submit", "arguments": {}}]</tool_call>')
    assert p.parse(text) == ParseResult([ToolCall("bash", {"command": "ls"}), ToolCall("python", {"code": "print(1)"}),
                                         ToolCall("submit", {})], [])
    assert p.parse("no call here") == ParseResult([], [])
    # the closing tag inside a JSON string does not end the call
    tricky = '<tool_call>{"name": "python", "arguments": {"code": "print(\'</tool_call>\')"}}</tool_call>'
    assert p.parse(tricky).calls == [ToolCall("python", {"code": "print('</tool_call>')"})]


@pytest.mark.parametrize(("text", "error"), [
    ("<tool_call>{bad json}</tool_call>", "the JSON in <tool_call> is invalid"),
    ('<tool_call>{"name": "bash", "arguments": {}}', "is not closed with </tool_call>"),
    ('<tool_call>{"name": "bash"} trailing</tool_call>', "has extra text after the JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'needs a "name" string'),
    ('<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "bash", "arguments": "not json"}</tool_call>', "a string that is not JSON"),
    ("<tool_call>42</tool_call>", "must be a JSON object"),
])
def test_hermes_errors(text: str, error: str) -> None:
    result = get_parser("hermes").parse(text)
    assert result.calls == [] and len(result.errors) == 1 and error in result.errors[0]


def test_hermes_keeps_good_calls_next_to_bad_ones() -> None:
    result = get_parser("hermes").parse('<tool_call>{x}</tool_call><tool_call>{"name": "a"}</tool_call>')
    assert result.calls == [ToolCall("a", {})] and len(result.errors) == 1


# ---------------------------------------------------------------------------------------------
# fenced
# ---------------------------------------------------------------------------------------------


def test_fenced_blocks() -> None:
    p = get_parser("fenced")
    text = ("Try this:\n```python\nprint(1)\n```\nand\n```sh\nls -la\n```\n"
            "```json\n{\"not\": \"a call\"}\n```\n````python\nx = '```'\n````\n```submit\n42\n```")
    assert p.parse(text) == ParseResult([ToolCall("python", {"code": "print(1)"}), ToolCall("bash", {"command": "ls -la"}),
                                         ToolCall("python", {"code": "x = '```'"}), ToolCall("submit", {"answer": "42"})], [])
    assert p.parse("```python\nprint(1)\n").errors == ["the ```python block is not closed with ```"]
    assert p.parse("```\njust code\n```") == ParseResult([], [])


def test_fenced_reaches_only_its_tools() -> None:
    p = get_parser("fenced")
    with pytest.raises(ValueError, match=r"cannot call tool.*str_replace_editor"):
        p.format_tools([python, str_replace_editor])
    assert "```bash" in p.format_tools([python, bash, submit])
    with pytest.raises(ValueError, match=r"fenced format can express only"):
        p.format_call(ToolCall("str_replace_editor", {"command": "view"}))


# ---------------------------------------------------------------------------------------------
# xml
# ---------------------------------------------------------------------------------------------


def test_xml_calls_and_coercion() -> None:
    p = get_parser("xml")
    text = ("<tool_call>\n<function=str_replace_editor>\n<parameter=command>\nview\n</parameter>\n"
            "<parameter=path>\na.py\n</parameter>\n<parameter=view_range>\n[1, 5]\n</parameter>\n</function>\n"
            "</tool_call><function=submit></function>")
    result = p.parse(text)
    assert result == ParseResult([ToolCall("str_replace_editor", {"command": "view", "path": "a.py", "view_range": "[1, 5]"}),
                                  ToolCall("submit", {})], [])
    # values arrive as strings; the tool's declared types coerce them
    assert str_replace_editor.validate(result.calls[0].arguments)["view_range"] == [1, 5]


@pytest.mark.parametrize(("text", "error"), [
    ("<function=bash><parameter=command>ls</parameter>", "is not closed with </function>"),
    ("<function=bash><parameter=command>ls</function>", "without </parameter>"),
    ("<function=bash><parameter=a>1</parameter><parameter=a>2</parameter></function>", "twice"),
    ("<function=></function>", "no function name"),
])
def test_xml_errors(text: str, error: str) -> None:
    result = get_parser("xml").parse(text)
    assert result.calls == [] and error in result.errors[0]


# ---------------------------------------------------------------------------------------------
# registry and formatters
# ---------------------------------------------------------------------------------------------


def test_registry() -> None:
    assert set(PARSERS) <= set(list_parsers())
    with pytest.raises(ValueError, match=r"unknown tool-call parser 'nope'; known: .*hermes"):
        get_parser("nope")
    with pytest.raises(ValueError, match=r"already registered"):
        register_parser("hermes", FencedParser)

    class Upper(FencedParser):
        name = "fenced-upper"
        languages = {"PY": ("python", "code")}  # noqa: RUF012

    register_parser("fenced-upper", Upper, overwrite=True)
    assert get_parser("fenced-upper").parse("```PY\nx\n```").calls == [ToolCall("python", {"code": "x"})]
    parser = get_parser("xml")
    assert get_parser(parser) is parser


@pytest.mark.parametrize("name", ["hermes", "xml"])
def test_format_tools_lists_every_tool_with_its_schema(name: str) -> None:
    text = get_parser(name).format_tools([bash, str_replace_editor, submit])
    for t in (bash, str_replace_editor, submit):
        assert json.dumps(t.spec(), ensure_ascii=False) in text


# ---------------------------------------------------------------------------------------------
# hypothesis: never raises, round trips
# ---------------------------------------------------------------------------------------------

FRAGMENTS = ["<tool_call>", "</tool_call>", "{", "}", '"name"', '"arguments"', ":", ",", "[", "]", '"', "\\",
             "```", "```python", "```bash", "````", "\n", "<function=", "<function=f>", "</function>",
             "<parameter=", "<parameter=x>", "</parameter>", ">", "null", "1e999", " "]
adversarial = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=30).map("".join)


@pytest.mark.parametrize("name", PARSERS)
@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(), adversarial))
def test_parsers_never_raise(name: str, text: str) -> None:
    result = get_parser(name).parse(text)
    assert isinstance(result, ParseResult)
    assert all(isinstance(c, ToolCall) and isinstance(c.arguments, dict) for c in result.calls)
    assert all(isinstance(e, str) and e for e in result.errors)
    assert not any(e.startswith("internal parser error") for e in result.errors)


@pytest.mark.parametrize("name", PARSERS)
def test_non_text_is_an_error_not_a_crash(name: str) -> None:
    assert get_parser(name).parse(None).errors == ["expected text, got NoneType"]  # type: ignore[arg-type]


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,15}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


def _roundtrip(name: str, calls: list[ToolCall]) -> None:
    parser = get_parser(name)
    text = "\n".join(parser.format_call(c) for c in calls)
    assert parser.parse(text) == ParseResult(calls, [])


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(st.builds(ToolCall, names, st.dictionaries(st.text(max_size=10), json_values, max_size=4)),
                      max_size=3))
def test_hermes_roundtrip(calls: list[ToolCall]) -> None:
    _roundtrip("hermes", calls)


fenced_calls = st.one_of(
    st.builds(lambda s: ToolCall("python", {"code": s}), st.text()),
    st.builds(lambda s: ToolCall("bash", {"command": s}), st.text()),
    st.builds(lambda s: ToolCall("submit", {"answer": s}), st.text()),
)


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(fenced_calls, max_size=3))
def test_fenced_roundtrip(calls: list[ToolCall]) -> None:
    _roundtrip("fenced", calls)


xml_text = st.text().filter(lambda s: "</parameter>" not in s and "</function>" not in s)
xml_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,15}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(st.builds(ToolCall, xml_names, st.dictionaries(xml_names, xml_text, max_size=4)), max_size=3))
def test_xml_roundtrip(calls: list[ToolCall]) -> None:
    _roundtrip("xml", calls)


@tool
def typed(n: int, xs: list[float], on: bool, label: str) -> str:
    """Typed."""
    return ""


@settings(max_examples=100, deadline=None)
@given(n=st.integers(), xs=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=4), on=st.booleans(),
       label=xml_text)
def test_xml_roundtrip_of_typed_arguments(n: int, xs: list[float], on: bool, label: str) -> None:
    """Non-string values travel as JSON text and come back typed after validation."""
    args: dict[str, Any] = {"n": n, "xs": xs, "on": on, "label": label}
    parser = get_parser("xml")
    (call,) = parser.parse(parser.format_call(ToolCall("typed", args))).calls
    assert typed.validate(call.arguments) == args
