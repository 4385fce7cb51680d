"""Python type hints → JSON schema, and validation/coercion of a model's arguments against them.

Supported hints: str, int, float, bool, list / list[X], dict / dict[str, X], Literal[...],
Optional[X] / X | None, Any. Coercion is what a model's text needs and nothing more: parsers
that carry only strings (the XML format) give "3" for an int, "true" for a bool and JSON text
for a list; everything else must already have the declared type.
"""

from __future__ import annotations

import json
import re
import types
from typing import Any, Literal, Union, get_args, get_origin

SUPPORTED = "str, int, float, bool, list[...], dict[str, ...], Literal[...], Optional[...], Any"
_INT_RE = re.compile(r"[-+]?\d+")
_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|infinity|nan)", re.IGNORECASE)


class ArgumentError(ValueError):
    """A tool argument that does not match its declared type; the message names both."""


def _optional_inner(hint: Any) -> Any | None:
    """X for Optional[X] / X | None, else None."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(get_args(hint)) == 2:
            return args[0]
    return None


def json_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of one type hint; TypeError for an unsupported one."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return {}
    if hint is str:
        return {"type": "string"}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if hint is list or origin is list:
        return {"type": "array", "items": json_schema(args[0])} if args else {"type": "array"}
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"dict keys must be str in a tool schema, got {hint}")
        return {"type": "object", "additionalProperties": json_schema(args[1])} if args else {"type": "object"}
    if origin is Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or not kinds <= {str, int, float, bool}:
            raise TypeError(f"Literal values must share one of str/int/float/bool, got {hint}")
        return {**json_schema(kinds.pop()), "enum": list(args)}
    inner = _optional_inner(hint)
    if inner is not None:
        schema = json_schema(inner)
        if isinstance(schema.get("type"), str):
            return {**schema, "type": [schema["type"], "null"]}
        return {"anyOf": [schema, {"type": "null"}]}
    raise TypeError(f"unsupported type hint {hint!r}; supported: {SUPPORTED}")


def type_name(hint: Any) -> str:
    """A short human name for error messages: 'integer', 'list of string', 'one of "a", "b"'."""
    origin, args = get_origin(hint), get_args(hint)
    names = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object",
             list: "list"}
    if hint in names:
        return names[hint]
    if hint is Any:
        return "any value"
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"object of {type_name(args[1])}"
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(a) for a in args)
    inner = _optional_inner(hint)
    if inner is not None:
        return f"{type_name(inner)} or null"
    return str(hint)


def _shown(value: Any) -> str:
    """A short repr for error messages that cannot itself fail (huge ints, deep nesting, odd objects)."""
    try:
        text = repr(value)
    except Exception:  # e.g. an int past Python's int-to-str digit limit
        return f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def coerce(value: Any, hint: Any, name: str) -> Any:
    """Return `value` as `hint`, or raise ArgumentError naming `name` and the expected type.
    Any other failure while converting (digit limits, recursion, overflow) becomes an
    ArgumentError too, so a model's argument can never raise anything else."""
    try:
        return _coerce(value, hint, name)
    except ArgumentError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as e:
        raise ArgumentError(f"argument '{name}' must be {type_name(hint)}, got {type(value).__name__} "
                            f"{_shown(value)} ({type(e).__name__}: {str(e)[:120]})") from None


def _coerce(value: Any, hint: Any, name: str) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    bad = ArgumentError(f"argument '{name}' must be {type_name(hint)}, got {type(value).__name__} {_shown(value)}")
    if hint is Any:
        return value
    inner = _optional_inner(hint)
    if inner is not None:
        if value is None or (isinstance(value, str) and value.strip() in ("null", "None") and inner is not str):
            return None
        return _coerce(value, inner, name)
    if value is None:
        raise bad
    if hint is str:
        if isinstance(value, str):
            return value
        raise bad
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise bad
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
            return int(value.strip())
        raise bad
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
            return float(value.strip())
        raise bad
    if hint is list or origin is list or hint is dict or origin is dict:
        want = list if (hint is list or origin is list) else dict
        if isinstance(value, str):  # string-only formats carry containers as JSON text
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise bad from None
        if not isinstance(value, want):
            raise bad
        if not args:
            return value
        if want is list:
            return [_coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value)]
        return {k: _coerce(v, args[1], f"{name}.{k}") for k, v in value.items()}
    if origin is Literal:
        if value in args and type(value) is type(args[0]):
            return value
        if isinstance(value, str) and not isinstance(args[0], str):
            try:
                converted = _coerce(value, type(args[0]), name)
            except ArgumentError:
                raise bad from None
            if converted in args:
                return converted
        raise bad
    raise bad
