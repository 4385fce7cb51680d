"""Tools whose arguments are described by a JSON schema someone else wrote (an MCP server's
`tools/list`, an OpenEnv server's Action model), not by Python type hints.

    t = schema_tool("step", "Act in the environment.", {"type": "object", "properties": {...}}, fn)
    await t.call({"guess": 3})      # fn(guess=3); arguments the schema rejects come back as ToolResult.error

The arguments are checked against the schema as given (`jsonschema`, the validator MCP and
OpenEnv themselves depend on) and passed to `fn` unchanged: no coercion, since the receiving
server validates with its own types.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.tools.core import Tool
from agentrl.tools.schema import ArgumentError


@dataclass(frozen=True, eq=False)
class SchemaTool(Tool):
    hints: dict[str, Any] = field(default_factory=dict, repr=False)

    def validate(self, args: Any) -> dict[str, Any]:
        if not isinstance(args, dict):
            raise ArgumentError(f"tool '{self.name}' takes a JSON object of arguments, got {type(args).__name__}")
        errors = sorted(_validator(json.dumps(self.parameters, sort_keys=True)).iter_errors(args),
                        key=lambda e: (len(e.absolute_path), e.message))
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path)
            raise ArgumentError(f"tool '{self.name}': invalid arguments"
                                f"{f' at {where!r}' if where else ''}: {errors[0].message}")
        return dict(args)


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    # jsonschema comes with the extras that produce such tools (agentrl[mcp], agentrl[openenv]),
    # so it is imported only when one is built.
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def schema_tool(name: str, description: str, parameters: dict[str, Any], fn: Callable[..., Any], *,
                terminal: bool = False, timeout: float | None = None, inject: tuple[str, ...] = ()) -> SchemaTool:
    """A tool that checks its arguments against `parameters` (a JSON schema of an object) and
    calls `fn(**arguments)` (sync or async), plus the `inject`ed names ToolEnv supplies (e.g. env)."""
    schema = {"type": "object", "properties": {}, **parameters}
    try:
        _validator(json.dumps(schema, sort_keys=True)).check_schema(schema)
    except Exception as e:
        raise ValueError(f"tool '{name}': its parameters are not a valid JSON schema: {e}") from e
    clash = sorted(set(inject) & set(schema["properties"]))
    if clash:
        raise ValueError(f"tool '{name}': argument {clash[0]!r} has the name of an injected value")
    return SchemaTool(name=name, description=description, parameters=schema, fn=fn, terminal=terminal,
                      timeout=timeout, inject=tuple(inject))
