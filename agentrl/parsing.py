"""Tool-call parsers: assistant text → tool calls, and tools → the system-prompt text (architecture.md §4).

One registry serves rollout, training and eval:

    parser = get_parser("hermes")
    result = parser.parse(text)          # ParseResult(calls=[ToolCall(...)], errors=[...])
    prompt = parser.format_tools(tools)  # how the model learns the tools and the call syntax
    text = parser.format_call(call)      # parse(format_call(c)).calls == [c]

Formats:
  hermes  <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>
  fenced  ```python / ```bash / ```submit blocks → python(code=…), bash(command=…), submit(answer=…)
  xml     <function=bash><parameter=command>ls</parameter></function>  (values are strings;
          `Tool.validate` coerces them to the declared types)

`parse` never raises: anything it cannot read becomes a message in `errors`, which the env
shows to the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from agentrl.tools.core import Tool, example_arguments


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class ParseResult:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Parser(Protocol):
    name: str

    def parse(self, text: str) -> ParseResult: ...

    def format_tools(self, tools: Sequence[Tool]) -> str: ...

    def format_call(self, call: ToolCall) -> str: ...


def _snippet(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _safe_parse(parse: Callable[[str], ParseResult], text: Any) -> ParseResult:
    """The never-raises guarantee, kept even if a parser has a bug."""
    if not isinstance(text, str):
        return ParseResult(errors=[f"expected text, got {type(text).__name__}"])
    try:
        return parse(text)
    except Exception as e:  # pragma: no cover - a parser bug; tests assert this never fires
        return ParseResult(errors=[f"internal parser error: {type(e).__name__}: {e}"])


def _tools_json(tools: Sequence[Tool]) -> str:
    return "\n".join(json.dumps(t.spec(), ensure_ascii=False) for t in tools)


# ---------------------------------------------------------------------------------------------
# hermes
# ---------------------------------------------------------------------------------------------


class HermesParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes / Qwen 2.5 style)."""

    name = "hermes"
    open_tag, close_tag = "<tool_call>", "</tool_call>"

    def parse(self, text: str) -> ParseResult:
        return _safe_parse(self._parse, text)

    def _parse(self, text: str) -> ParseResult:
        result = ParseResult()
        decoder = json.JSONDecoder()
        pos = 0
        while (start := text.find(self.open_tag, pos)) >= 0:
            body = _skip_ws(text, start + len(self.open_tag))
            close = text.find(self.close_tag, body)
            try:
                # raw_decode reads exactly one JSON value, so a "</tool_call>" inside a string is safe
                obj, end = decoder.raw_decode(text, body)
            except json.JSONDecodeError as e:
                result.errors.append(f"the JSON in <tool_call> is invalid ({e.msg} at char {e.pos - body}): "
                                     f"{_snippet(text[body: close if close >= 0 else None])}")
                pos = close + len(self.close_tag) if close >= 0 else len(text)
                continue
            after = _skip_ws(text, end)
            if not text.startswith(self.close_tag, after):
                close = text.find(self.close_tag, after)
                what = "is not closed with </tool_call>" if close < 0 else "has extra text after the JSON"
                result.errors.append(f"<tool_call> {what}: {_snippet(text[start: close if close >= 0 else None])}")
                pos = close + len(self.close_tag) if close >= 0 else len(text)
                continue
            pos = after + len(self.close_tag)
            for item in obj if isinstance(obj, list) else [obj]:
                call = _call_from_json(item)
                if isinstance(call, str):
                    result.errors.append(call)
                else:
                    result.calls.append(call)
        return result

    def format_call(self, call: ToolCall) -> str:
        payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{self.open_tag}\n{payload}\n{self.close_tag}"

    def format_tools(self, tools: Sequence[Tool]) -> str:
        return ("# Tools\n\nYou may call one or more functions. The function signatures are within "
                f"<tools></tools> XML tags:\n<tools>\n{_tools_json(tools)}\n</tools>\n\n"
                "For each function call, return a JSON object with the function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _call_from_json(obj: Any) -> ToolCall | str:
    """A ToolCall, or the reason the JSON is not one."""
    if not isinstance(obj, dict):
        return f"a tool call must be a JSON object with \"name\" and \"arguments\", got {_snippet(json.dumps(obj))}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return f"a tool call needs a \"name\" string, got {_snippet(json.dumps(obj))}"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models send the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return f"the arguments of '{name}' are a string that is not JSON: {_snippet(args)}"
    if not isinstance(args, dict):
        return f"the arguments of '{name}' must be a JSON object, got {_snippet(json.dumps(args))}"
    return ToolCall(name, args)


# ---------------------------------------------------------------------------------------------
# fenced code blocks
# ---------------------------------------------------------------------------------------------

_OPEN_FENCE = re.compile(r" {0,3}(`{3,})[ \t]*([^\s`]*)[^`]*")


class FencedParser:
    """Markdown code blocks: the info string picks the tool, the body is its one argument."""

    name = "fenced"
    languages: ClassVar[dict[str, tuple[str, str]]] = {
        "python": ("python", "code"), "py": ("python", "code"), "python3": ("python", "code"),
        "bash": ("bash", "command"), "sh": ("bash", "command"), "shell": ("bash", "command"),
        "submit": ("submit", "answer"),
    }

    def parse(self, text: str) -> ParseResult:
        return _safe_parse(self._parse, text)

    def _parse(self, text: str) -> ParseResult:
        result = ParseResult()
        languages = {k.lower(): v for k, v in self.languages.items()}  # info strings match case-insensitively
        lines = text.split("\n")
        i = 0
        while i < len(lines):
            m = _OPEN_FENCE.fullmatch(lines[i].rstrip("\r"))
            if not m:
                i += 1
                continue
            closing = re.compile(r" {0,3}`{" + str(len(m.group(1))) + r",}[ \t\r]*")  # at least as long
            j = next((k for k in range(i + 1, len(lines)) if closing.fullmatch(lines[k])), len(lines))
            target = languages.get(m.group(2).lower())
            if target is not None:
                if j == len(lines):
                    result.errors.append(f"the ```{m.group(2)} block is not closed with ```")
                else:
                    result.calls.append(ToolCall(target[0], {target[1]: "\n".join(lines[i + 1: j])}))
            i = j + 1
        return result

    def _targets(self) -> dict[str, tuple[str, str]]:
        """tool name → (info string, argument), first language listed wins."""
        out: dict[str, tuple[str, str]] = {}
        for lang, (tool_name, arg) in self.languages.items():
            out.setdefault(tool_name, (lang, arg))
        return out

    def format_call(self, call: ToolCall) -> str:
        target = self._targets().get(call.name)
        if target is None or set(call.arguments) - {target[1]}:
            raise ValueError(f"the fenced format can express only {self._describe()}; got {call}")
        body = call.arguments.get(target[1], "")
        if not isinstance(body, str):
            raise ValueError(f"the fenced format carries only a string {target[1]!r}, got {type(body).__name__}")
        longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
        fence = "`" * max(3, longest + 1)
        return f"{fence}{target[0]}\n{body}\n{fence}"

    def _describe(self) -> str:
        return ", ".join(f"{t}({a}=...) as a ```{lang} block" for t, (lang, a) in self._targets().items())

    def format_tools(self, tools: Sequence[Tool]) -> str:
        targets = self._targets()
        unreachable = [t.name for t in tools if t.name not in targets]
        if unreachable:
            raise ValueError(f"parser 'fenced' cannot call tool(s) {', '.join(unreachable)}; it expresses only "
                             f"{', '.join(targets)}. Use parser 'hermes' or 'xml' for other tools.")
        lines = ["# Tools", "", "Act by writing a fenced code block; it runs and you see its output."]
        for t in tools:
            lang, arg = targets[t.name]
            lines.append(f"- ```{lang} block: {t.name} — {t.description} (the block is the `{arg}`)")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# XML functions
# ---------------------------------------------------------------------------------------------

_FUNCTION_OPEN = re.compile(r"<function=([^>\s]*)>")
_PARAM = re.compile(r"<parameter=([^>\s]*)>(.*?)</parameter>", re.DOTALL)


class XMLParser:
    """`<function=name><parameter=x>value</parameter></function>` (Qwen3-Coder style)."""

    name = "xml"

    def parse(self, text: str) -> ParseResult:
        return _safe_parse(self._parse, text)

    def _parse(self, text: str) -> ParseResult:
        result = ParseResult()
        pos = 0
        while (m := _FUNCTION_OPEN.search(text, pos)) is not None:
            end = text.find("</function>", m.end())
            if end < 0:
                result.errors.append(f"<function={m.group(1)}> is not closed with </function>")
                break
            pos = end + len("</function>")
            name, body = m.group(1), text[m.end(): end]
            if not name:
                result.errors.append("a <function=...> tag has no function name")
                continue
            args: dict[str, Any] = {}
            problem = None
            for p in _PARAM.finditer(body):
                if p.group(1) in args:
                    problem = f"<function={name}> gives parameter '{p.group(1)}' twice"
                args[p.group(1)] = _strip_one_newline(p.group(2))
            leftover = _PARAM.sub("", body)
            if "<parameter=" in leftover:
                problem = f"<function={name}> has a <parameter=...> without </parameter>"
            if problem:
                result.errors.append(problem)
            else:
                result.calls.append(ToolCall(name, args))
        return result

    def format_call(self, call: ToolCall) -> str:
        parts = [f"<tool_call>\n<function={call.name}>"]
        for key, value in call.arguments.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            if "</parameter>" in text or "</function>" in text:
                raise ValueError(f"the xml format cannot carry parameter {key!r}: its value contains a closing tag")
            parts.append(f"<parameter={key}>\n{text}\n</parameter>")
        parts.append("</function>\n</tool_call>")
        return "\n".join(parts)

    def format_tools(self, tools: Sequence[Tool]) -> str:
        example = ToolCall("example_function_name", {"example_parameter": "value"})
        if tools:
            example = ToolCall(tools[0].name, {k: v if isinstance(v, str) else json.dumps(v)
                                               for k, v in example_arguments(tools[0]).items()})
        return ("# Tools\n\nYou have access to the following functions:\n<tools>\n"
                f"{_tools_json(tools)}\n</tools>\n\n"
                "To call a function, reply in the following format (one <parameter> per argument; "
                "lists and objects as JSON):\n" + self.format_call(example))


def _strip_one_newline(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------

_PARSERS: dict[str, Callable[[], Parser]] = {
    "hermes": HermesParser,
    "fenced": FencedParser,
    "xml": XMLParser,
}


def register_parser(name: str, factory: Callable[[], Parser], *, overwrite: bool = False) -> None:
    """Add a parser under `name` (a class or any zero-argument factory)."""
    if name in _PARSERS and not overwrite:
        raise ValueError(f"parser '{name}' is already registered (pass overwrite=True to replace it)")
    _PARSERS[name] = factory


def get_parser(name: str | Parser) -> Parser:
    """A parser instance by name (an instance passes through)."""
    if not isinstance(name, str):
        return name
    try:
        return _PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call parser '{name}'; known: {', '.join(sorted(_PARSERS))}") from None


def list_parsers() -> list[str]:
    return sorted(_PARSERS)
