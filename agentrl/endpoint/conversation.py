"""OpenAI chat requests ⇄ token ids, for one episode of an agent program (issue 54).

An agent program sends whole conversations; the policy was trained on token ids. `Conversation`
turns each request into the prompt ids the policy sees, the way the rollout engine builds a
context (`agentrl/rollout/tokens.py`): when a request continues an earlier request of the episode
(its messages are that request's, then the assistant message agentrl returned, then new
messages), the prompt is that request's prompt and sampled tokens, token for token, plus the
template's tokens for the new messages; the sampled tokens are never re-tokenized. When a chat
template rewrote the history (dropped a past `<think>` block), the rendering no longer extends
and the request is rendered fresh; `segments_from_samples` then trains it step-wise.

Tools: a template that knows tools (its source mentions `tools`) gets them as the template's own
`tools=` argument; any other gets the parser's tool description appended to the system message,
exactly as `ToolEnv` writes it, and calls in past assistant messages rendered in the parser's
format. Tool calls in a completion are read by agentrl's parser (`agentrl/parsing.py`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.parsing import Parser, ToolCall
from agentrl.rollout.stepwise import Sample
from agentrl.rollout.tokens import ChatTemplateError, ChatTokens
from agentrl.tools.core import Tool
from agentrl.types import Message

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class RequestError(ValueError):
    """A request the endpoint cannot serve: answered with an OpenAI-style error body."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _unusable(_: Any = None, **__: Any) -> None:  # a request's tool is described, never run here
    raise RuntimeError("the agent program runs its own tools")


def tools_from_specs(specs: Any) -> list[Tool]:
    """OpenAI `tools` ([{"type": "function", "function": {name, description, parameters}}]) as
    agentrl `Tool`s, so the parsers describe them the way they describe an env's tools."""
    if specs is None:
        return []
    if not isinstance(specs, list):
        raise RequestError("'tools' must be a list of {\"type\": \"function\", \"function\": {...}}", param="tools")
    tools = []
    for i, spec in enumerate(specs):
        fn = spec.get("function") if isinstance(spec, dict) and spec.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                               param=f"tools[{i}]")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object",
                               param=f"tools[{i}].function.parameters")
        params = {"type": "object", "properties": {}, **params}
        tools.append(Tool(fn["name"], str(fn.get("description") or ""), params, _unusable, {}))
    return tools


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise RequestError(f"{where}.content: only text parts are supported, got {str(part)[:80]}",
                                   param=f"{where}.content")
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where}.content must be a string or a list of text parts", param=f"{where}.content")


def _arguments(call: Any, where: str) -> tuple[str, dict[str, Any]]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(f"{where} must be {{\"function\": {{\"name\": ..., \"arguments\": \"{{...}}\"}}}}",
                           param=where)
    raw = fn.get("arguments") or "{}"
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as e:
        raise RequestError(f"{where}.function.arguments is not JSON: {e.msg}", param=where) from None
    if not isinstance(args, dict):
        raise RequestError(f"{where}.function.arguments must be a JSON object", param=where)
    return fn["name"], args


def _assistant_key(content: str, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """What identifies an assistant message agentrl returned when the program sends it back
    (frameworks drop whitespace, re-serialize arguments and add ids; none of that matters)."""
    return json.dumps([content.strip(), [[n, a] for n, a in calls]], sort_keys=True)


@dataclass
class Completion:
    """One sampled completion as the program reads it."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class Conversation:
    """One episode's requests: prompt ids that extend earlier samples where the template allows."""

    def __init__(self, chat: ChatTokens, parser: Parser, compare_renderings: bool = True) -> None:
        self.chat, self.parser = chat, parser
        # As the rollout engine: a template that passed its start-up check (verify_append_only) is
        # trusted to append, its deltas raising HistoryRewrite where it rewrote; any other has each
        # extended prompt compared with its whole rendering.
        self.compare_renderings = compare_renderings
        self.native_tools = "tools" in str(getattr(chat.tokenizer, "chat_template", "") or "")
        self._returned: dict[str, str] = {}  # assistant message key → the exact text the policy sampled
        self._history: list[tuple[list[Message], dict[str, Any], Sample]] = []  # (context, template kwargs, sample)
        self.opening: int | None = None  # the first prompt's closed part (Sample.prompt_len)

    @property
    def last_context(self) -> list[Message]:
        """The latest request's messages (as rendered) and the assistant message it got."""
        return list(self._history[-1][0]) if self._history else []

    # -- request → prompt ids -------------------------------------------------------------------

    def messages(self, raw: Any, tools: Sequence[Tool]) -> list[Message]:
        """The request's messages as the template renders them (see the module docstring)."""
        if not isinstance(raw, list) or not raw:
            raise RequestError("'messages' must be a non-empty list of chat messages", param="messages")
        out: list[Message] = []
        for i, m in enumerate(raw):
            where = f"messages[{i}]"
            role = _ROLES.get(m.get("role")) if isinstance(m, dict) else None
            if role is None:
                raise RequestError(f"{where}.role must be one of {', '.join(_ROLES)}", param=f"{where}.role")
            content = _text(m.get("content"), where)
            if role == "assistant":
                calls = [_arguments(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(m.get("tool_calls") or [])]
                sampled = self._returned.get(_assistant_key(content, calls))
                if sampled is not None:
                    content = sampled
                elif calls and not self.native_tools:
                    shown = [self.parser.format_call(ToolCall(n, a)) for n, a in calls]
                    content = "\n".join([content, *shown] if content else shown)
                elif calls:
                    out.append(Message(role="assistant", content=content, tool_calls=[  # type: ignore[typeddict-unknown-key]
                        {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]))
                    continue
            out.append(Message(role=role, content=content))
        if tools and not self.native_tools:
            described = self.parser.format_tools(list(tools))
            if out[0]["role"] == "system":  # ToolEnv's layout: the system prompt, a blank line, the tools
                out[0] = Message(role="system", content=f"{out[0]['content']}\n\n{described}")
            else:
                out.insert(0, Message(role="system", content=described))
        return out

    def template_kwargs(self, tools: Sequence[Tool]) -> dict[str, Any]:
        return {"tools": [t.spec() for t in tools]} if tools and self.native_tools else {}

    def prompt_ids(self, context: list[Message], template_kwargs: dict[str, Any]) -> list[int]:
        """The ids the policy sees: an earlier sample's tokens extended, else a fresh rendering."""
        chat = self.chat if not template_kwargs else ChatTokens(self.chat.tokenizer, self.chat.eos_token_ids,
                                                                 template_kwargs)
        for previous, kwargs, sample in reversed(self._history):
            if kwargs == template_kwargs and len(context) > len(previous) and context[: len(previous)] == previous:
                ids = self._extend(chat, previous, sample, context)
                if ids is not None:
                    return ids
                break
        if not self._history:  # the first request: laid out as the rollout engine opens a context
            try:
                closed = chat.prompt(context)
                self.opening = len(closed)
                return closed + chat.generation_prompt(context)
            except ChatTemplateError:
                pass
        # The template's whole rendering (a step-wise row's prompt, as the rollout engine makes it).
        return chat.encode(chat.render(context, generation_prompt=True))

    def _extend(self, chat: ChatTokens, previous: list[Message], sample: Sample, context: list[Message]
                ) -> list[int] | None:
        """`sample`'s prompt and tokens, then the template's tokens for what `context` adds, as
        the rollout engine appends them; None when the template does not render the result that
        way (it rewrote the history)."""
        new = context[len(previous):]
        try:
            ids = (sample.prompt_ids + sample.completion_ids
                   + chat.close_assistant(previous, chat.ends_turn(sample.completion_ids))
                   + chat.append_messages(previous, new) + chat.generation_prompt(context))
        except ChatTemplateError:
            return None
        if self.compare_renderings and chat.decode(ids) != chat.render(context, generation_prompt=True):
            return None
        return ids

    # -- sample → what the program reads --------------------------------------------------------

    def record(self, context: list[Message], template_kwargs: dict[str, Any], sample: Sample,
               parse_tools: bool) -> Completion:
        """Remember `sample` (later requests extend it) and return it as an assistant message."""
        self._history.append(([*context, Message(role="assistant", content=sample.text)], template_kwargs, sample))
        completion = self.completion(sample.text, parse_tools)
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in completion.tool_calls]
        self._returned[_assistant_key(completion.content or "", calls)] = sample.text
        return completion

    def completion(self, text: str, parse_tools: bool) -> Completion:
        parsed = self.parser.parse(text) if parse_tools else None
        if parsed is None or not parsed.calls:
            return Completion(text)
        marker = getattr(self.parser, "open_tag", None)
        before = text[: text.find(marker)].strip() if marker and marker in text else text.strip()
        calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                 for c in parsed.calls]
        return Completion(before or None, calls)
