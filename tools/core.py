"""`@tool`: a typed Python function becomes a tool a model can call (architecture.md §4).

    @tool
    def add(a: int, b: int = 1) -> str:
        '''Add two integers.

        Args:
            a: the first number
            b: the second number
        '''
        return str(a + b)

    await add.call({"a": "2"})          # ToolResult(output="3", error=None)

The JSON schema comes from the type hints (`tools/schema.py`) and the parameter descriptions from
the docstring (`tools/docstring.py`). Parameters named in `inject=` (the sandbox, the env state,
...) are supplied by the environment and hidden from the model. A call never raises for anything
the model did: bad arguments, an exception in the tool and a timeout all come back as
`ToolResult.error`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.tools.docstring import parse_docstring
from agentrl.tools.schema import ArgumentError, coerce, json_schema

# Extra seconds a tool that enforces its own limit (it takes the injected `timeout`, e.g. a
# sandbox exec that kills the process group) gets before the outer guard cancels it.
_SELF_TIMED_GRACE_S = 5.0
_MAX_ERROR_CHARS = 2000  # an argument error names what was wrong, not all of a huge argument


@dataclass
class ToolResult:
    output: str = ""
    error: str | None = None  # set when the call failed; the model reads it
    fault: str | None = None  # a sandbox limit the call ran into (agentrl.sandboxes.common.FAULT_KINDS)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, eq=False)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of an object, as in OpenAI function calling
    fn: Callable[..., Any]
    hints: dict[str, Any] = field(repr=False)  # model-visible parameter → type hint
    inject: tuple[str, ...] = ()
    terminal: bool = False  # a call ends the episode (submit)
    timeout: float | None = None  # seconds; None = the env's default

    def spec(self) -> dict[str, Any]:
        """The OpenAI-style function description."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def validate(self, args: Any) -> dict[str, Any]:
        """The model's arguments coerced to the declared types; ArgumentError names the problem."""
        if not isinstance(args, dict):
            raise ArgumentError(f"tool '{self.name}' takes a JSON object of arguments, got {type(args).__name__}")
        unknown = [k for k in args if k not in self.hints]
        if unknown:
            raise ArgumentError(f"tool '{self.name}' has no argument {', '.join(repr(k) for k in unknown)}; "
                                f"it takes: {', '.join(self.hints) or 'no arguments'}")
        missing = [k for k in self.parameters.get("required", []) if k not in args]
        if missing:
            raise ArgumentError(f"tool '{self.name}' is missing required argument "
                                f"{', '.join(repr(k) for k in missing)}")
        return {k: coerce(v, self.hints[k], k) for k, v in args.items()}

    async def call(self, args: Any, /, **injected: Any) -> ToolResult:
        """Validate `args`, run the tool, and report any failure as `ToolResult.error`.

        `injected` must supply every name in `self.inject`. The reserved keyword `timeout`
        (seconds) overrides `self.timeout` for this call and is passed on to the function when
        it declares `inject=("timeout",)`.
        """
        limit = injected.pop("timeout", None)
        limit = self.timeout if limit is None else limit
        missing = [n for n in self.inject if n not in injected and n != "timeout"]
        if missing:  # a wiring bug in the caller, not the model's fault
            raise TypeError(f"tool '{self.name}' needs injected {', '.join(missing)}")
        try:
            kwargs = self.validate(args)
        except ArgumentError as e:
            return ToolResult(error=truncate(str(e), _MAX_ERROR_CHARS))
        except Exception as e:  # nothing a model sends may raise out of a tool call
            return ToolResult(error=truncate(f"tool '{self.name}': invalid arguments ({type(e).__name__}: {e})",
                                             _MAX_ERROR_CHARS))
        kwargs.update({n: injected[n] for n in self.inject if n != "timeout"})
        if "timeout" in self.inject:
            kwargs["timeout"] = limit
        guard = None if limit is None else limit + (_SELF_TIMED_GRACE_S if "timeout" in self.inject else 0.0)
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await asyncio.wait_for(self.fn(**kwargs), guard)
            else:  # a sync tool must not block the event loop other trajectories share
                value = await asyncio.wait_for(asyncio.to_thread(self.fn, **kwargs), guard)
        except asyncio.TimeoutError:  # past the guard: a sandboxed call's wall clock is a sandbox fault
            return ToolResult(error=f"tool '{self.name}' timed out after {limit:g} s",
                              fault="timeout" if "sandbox" in self.inject else None)
        except Exception as e:  # a SandboxDead carries its fault kind
            return ToolResult(error=f"tool '{self.name}' raised {type(e).__name__}: {e}", fault=getattr(e, "fault", None))
        return _as_result(value)


def _as_result(value: Any) -> ToolResult:
    if isinstance(value, ToolResult):
        return value
    if value is None:
        return ToolResult()
    if isinstance(value, str):
        return ToolResult(output=value)
    try:
        return ToolResult(output=json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError):
        return ToolResult(output=str(value))


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None,
         inject: tuple[str, ...] | list[str] = (), terminal: bool = False,
         timeout: float | None = None) -> Any:
    """Turn a typed function (sync or async) into a `Tool`. Usable bare or with options."""
    if isinstance(inject, str):
        inject = (inject,)

    def build(f: Callable[..., Any]) -> Tool:
        tool_name = name or f.__name__
        summary, param_docs = parse_docstring(f.__doc__)
        try:
            hints = typing.get_type_hints(f)
        except Exception as e:
            raise TypeError(f"tool '{tool_name}': cannot resolve type hints: {e}") from e
        sig = inspect.signature(f)
        for n in inject:
            if n not in sig.parameters:
                raise TypeError(f"tool '{tool_name}': inject names '{n}', which is not a parameter of "
                                f"{f.__name__}{sig}")
        properties: dict[str, Any] = {}
        required: list[str] = []
        visible: dict[str, Any] = {}
        for p in sig.parameters.values():
            if p.name in inject:
                continue
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
                raise TypeError(f"tool '{tool_name}': parameter '{p.name}' must be a plain named parameter")
            if p.name not in hints:
                raise TypeError(f"tool '{tool_name}': parameter '{p.name}' needs a type hint")
            try:
                prop = json_schema(hints[p.name])
            except TypeError as e:
                raise TypeError(f"tool '{tool_name}': parameter '{p.name}': {e}") from None
            if param_docs.get(p.name):
                prop["description"] = param_docs[p.name]
            if p.default is p.empty:
                required.append(p.name)
            elif _jsonable(p.default):
                prop["default"] = p.default
            properties[p.name] = prop
            visible[p.name] = hints[p.name]
        parameters: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            parameters["required"] = required
        return Tool(name=tool_name, description=description or summary, parameters=parameters, fn=f,
                    hints=visible, inject=tuple(inject), terminal=terminal, timeout=timeout)

    return build(fn) if fn is not None else build


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def example_arguments(t: Tool) -> dict[str, Any]:
    """Placeholder arguments that satisfy `t`'s schema (for help messages and env checks)."""
    return {k: _example(s) for k, s in t.parameters["properties"].items() if k in t.parameters.get("required", [])}


def _example(schema: dict[str, Any]) -> Any:
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "string")
    kind = kind[0] if isinstance(kind, list) else kind
    return {"string": "...", "integer": 0, "number": 0.0, "boolean": False, "array": [], "object": {}}.get(kind, "...")


def truncate(text: str, limit: int) -> str:
    """Keep the head and tail of `text` within `limit` chars around a visible marker."""
    if limit < 0:
        raise ValueError(f"truncation limit must be >= 0, got {limit}")
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... truncated {dropped} chars ...]\n{text[len(text) - tail:] if tail else ''}"


def state_get(state: Any, key: str, default: Any = None) -> Any:
    """Read `key` from an episode state that is a dict or an object with attributes."""
    return state.get(key, default) if isinstance(state, dict) else getattr(state, key, default)


def state_set(state: Any, key: str, value: Any) -> None:
    """Write `key` into an episode state that is a dict or an object with attributes."""
    if state is None:
        raise TypeError(f"this tool keeps '{key}' in the episode state, but the state is None")
    if isinstance(state, dict):
        state[key] = value
    else:
        setattr(state, key, value)
