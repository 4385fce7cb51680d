"""The sampling fields of OpenAI chat and completion requests, checked (issue 54).

Every problem is a `RequestError` naming the field and what it must be, which the endpoint
answers as an OpenAI-style 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.endpoint.conversation import RequestError

MAX_N = 16


@dataclass(frozen=True)
class Sampling:
    """What a request asked for; None: the endpoint's default."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"'{name}' must be a number in [{low:g}, {high:g}], got {value!r}", param=name)
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RequestError(f"'{name}' must be an integer >= {low}, got {value!r}", param=name)
    return value


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise RequestError(f"'{name}' must be true or false, got {value!r}", param=name)
    return bool(value)


def parse_sampling(body: Any, *, chat: bool) -> Sampling:
    """The sampling fields of a chat (`chat`) or completion request body."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise RequestError("'stop' must be a string or a list of non-empty strings", param="stop")
    logprobs: bool
    if chat:
        logprobs = _flag(body, "logprobs")
        if body.get("top_logprobs"):
            raise RequestError("'top_logprobs' is not supported: the endpoint returns each sampled token's "
                               "log-prob (set logprobs: true)", param="top_logprobs")
    else:  # the completions API takes logprobs as a count of alternatives; 0 gives the sampled token's
        count = _integer(body, "logprobs", 0)
        if count:
            raise RequestError("'logprobs' > 0 (alternatives) is not supported: use 0 for each sampled "
                               "token's log-prob", param="logprobs")
        logprobs = count is not None
        if body.get("echo"):
            raise RequestError("'echo' is not supported", param="echo")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object", param="stream_options")
    max_tokens = _integer(body, "max_completion_tokens", 1) if chat else None
    return Sampling(
        temperature=_number(body, "temperature", 0.0, 2.0), top_p=_number(body, "top_p", 1e-9, 1.0),
        max_tokens=max_tokens if max_tokens is not None else _integer(body, "max_tokens", 1),
        stop=tuple(stop or ()), n=_count(body), seed=_integer(body, "seed", 0), logprobs=logprobs,
        stream=_flag(body, "stream"), include_usage=bool(options.get("include_usage")))


def _count(body: dict[str, Any]) -> int:
    n = _integer(body, "n", 1)
    if n is not None and n > MAX_N:
        raise RequestError(f"'n' must be at most {MAX_N}, got {n}", param="n")
    return n or 1


def tool_choice(body: dict[str, Any]) -> str | None:
    """"none" (no calls are read), "auto"/"required", or the one function name asked for. The
    endpoint does not constrain decoding: the policy's text is what it sampled, calls are read from it."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "required", "none"):
        return choice
    fn = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        return fn["name"]
    raise RequestError("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}", param="tool_choice")
