"""MCP servers' tools as agentrl tools, for any ToolEnv (docs/interop.md#mcp-tools).

    class MyEnv(ToolEnv):
        tools = (*mcp_tools("python -m my_server"), submit)          # a stdio server
        tools = (*mcp_tools("http://127.0.0.1:8931/mcp"), submit)    # a streamable-HTTP server

`mcp_tools` asks the server for its tools once (`tools/list`; a stdio server is started for it and
stopped) and returns one tool per MCP tool, with the server's name, description and JSON schema.
A call goes through `tools/call` on the episode's own session: a stdio server is started at the
episode's first call and stopped when the episode ends (or the env closes), so its state never
leaks across episodes; an HTTP server is reached on the address given, with a fresh MCP session
per episode. Arguments the schema rejects, a result flagged `isError`, a server that crashes, hangs
past the tool's timeout or answers with a protocol error all come back as the tool's error, which
the model reads; a crashed or hung stdio server is replaced at the next call.

In an env with a sandbox (`needs_sandbox = True`), an episode's stdio server runs inside the
episode's sandbox (`Sandbox.spawn_argv`; the local bubblewrap backend): its cwd is the sandbox's
/work, it has no network and the sandbox's limits, and it dies with the sandbox. The host paths
`ro_binds` (default: this interpreter and its venv, and the directory of each absolute path in the
command) are shown read-only at the same paths so that the server's code and `mcp` are there. The
listing at definition time, and the servers of an env without a sandbox, run on this host as
children of the trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shlex
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.sandboxes.common import WORKDIR
from agentrl.tools.core import Tool, ToolResult
from agentrl.tools.jsonschema_tool import schema_tool

INSTALL = "pip install 'agentrl[mcp]'"
_POLL_S = 0.1  # how soon after an episode ends its server is stopped
DEFAULT_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0  # a stdio server's start-up (a Python one imports `mcp`: seconds on a busy host)


class MCPError(RuntimeError):
    """An MCP server could not be started or listed (raised by `mcp_tools`, at definition time)."""


@dataclass(frozen=True)
class MCPServer:
    """Where a server is: a stdio command line, or a streamable-HTTP URL."""

    command: tuple[str, ...] = ()
    url: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    ro_binds: tuple[str, ...] = ()  # host paths a sandboxed server sees (read-only, at the same paths)

    @classmethod
    def parse(cls, target: str | Sequence[str], *, env: dict[str, str] | None = None,
              cwd: str | None = None, ro_binds: Sequence[str] | None = None) -> MCPServer:
        if isinstance(target, str) and target.startswith(("http://", "https://")):
            return cls(url=target)
        argv = tuple(shlex.split(target) if isinstance(target, str) else target)
        if not argv:
            raise ValueError("mcp_tools needs a command line (e.g. 'python -m my_server') or an http(s):// URL")
        binds = _default_binds(argv) if ro_binds is None else tuple(ro_binds)
        return cls(command=argv, env=tuple(sorted((env or {}).items())), cwd=cwd, ro_binds=binds)

    def __str__(self) -> str:
        return self.url or shlex.join(self.command)


def _default_binds(argv: Sequence[str]) -> tuple[str, ...]:
    """What a sandboxed server needs from the host by default: this interpreter and its venv (a
    Python server imports `mcp` from there), and the directory of each absolute path in its command
    (its script). /usr is in every sandbox already."""
    paths = {sys.prefix, sys.base_prefix}
    paths.update(os.path.dirname(a) for a in argv if os.path.isabs(a) and os.path.isfile(a))
    return tuple(sorted(p for p in paths if p != "/usr" and not p.startswith("/usr/")))


def _require_mcp() -> Any:
    try:
        import mcp  # optional: the mcp extra
    except ImportError:
        raise MCPError(f"the `mcp` package is not installed (MCP tools need it); fix: {INSTALL}") from None
    return mcp


@contextlib.asynccontextmanager
async def _connect(server: MCPServer, sandbox: Any = None) -> Any:
    """An initialized mcp.ClientSession on `server` (the process, for stdio, lives as long as this;
    inside `sandbox` when one is given)."""
    mcp = _require_mcp()
    if server.url is not None:
        try:  # mcp >= 2
            # optional: the mcp extra
            from mcp.client.streamable_http import streamable_http_client as http_client
        except ImportError:  # mcp 1.x
            # optional: the mcp extra
            from mcp.client.streamable_http import streamablehttp_client as http_client
        transport = http_client(server.url)
    else:
        from mcp.client.stdio import stdio_client  # optional: the mcp extra

        if sandbox is None:
            argv, env, cwd = list(server.command), {**os.environ, **dict(server.env)}, server.cwd
        else:  # the sandbox's own env and cwd (/work), not the trainer's
            argv = sandbox.spawn_argv(list(server.command), env=dict(server.env), ro_binds=server.ro_binds,
                                      cwd=server.cwd or WORKDIR)
            env, cwd = {"PATH": os.environ.get("PATH", os.defpath)}, None
        params = mcp.StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=cwd)
        transport = stdio_client(params, errlog=open(os.devnull, "w"))  # noqa: SIM115 - closed with the process
    async with transport as streams, mcp.ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session


@functools.lru_cache(maxsize=64)
def list_tools(server: MCPServer, timeout_s: float = START_TIMEOUT_S) -> list[dict[str, Any]]:
    """`tools/list` of `server` as [{"name", "description", "inputSchema"}], asked once per process
    (an env module is imported again for each env built from a file path), on a thread of its own
    so that it works from inside a running event loop too."""
    async def ask() -> list[dict[str, Any]]:
        async with _connect(server) as session:
            listed = await session.list_tools()
            return [{"name": t.name, "description": t.description or "", "inputSchema": _field(t, "input_schema")}
                    for t in listed.tools]

    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["tools"] = asyncio.run(asyncio.wait_for(ask(), timeout_s))
        except BaseException as e:  # reported in the caller's thread
            out["error"] = e

    thread = threading.Thread(target=run, name="mcp-list-tools", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        e = out["error"]
        if isinstance(e, MCPError):
            raise e
        raise MCPError(f"MCP server `{server}` did not list its tools: {_describe(e)}") from e
    return out["tools"]


class _Session:
    """One episode's session on one server. A task of its own enters and leaves the MCP client's
    context (its anyio cancel scopes must open and close in one task); calls are made on the
    session from the tool's task. It ends when the episode does: ToolEnv has no end-of-episode
    hook for tools, so the owner watches the env (`done`, or a new episode's state)."""

    def __init__(self, server: MCPServer, env: Any, episode_state: Any, sandbox: Any) -> None:
        self.server, self.env, self.episode_state, self.sandbox = server, env, episode_state, sandbox
        self.session: Any = None
        self.ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.stop = asyncio.Event()
        self.task = asyncio.ensure_future(self._own())

    def current(self) -> bool:
        return (not self.task.done() and not self.stop.is_set() and self.env.state is self.episode_state
                and not getattr(self.env, "done", False))

    async def _own(self) -> None:
        try:
            async with _connect(self.server, self.sandbox) as session:
                self.session = session
                self.ready.set_result(session)
                while self.current():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.stop.wait(), _POLL_S)
        except BaseException as e:
            if not self.ready.done():
                self.ready.set_exception(e if isinstance(e, Exception) else MCPError(repr(e)))
            if not isinstance(e, Exception):
                raise
        finally:
            self.session = None

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(self.task, return_exceptions=True)


def _sessions(env: Any) -> dict[MCPServer, _Session]:
    return env.__dict__.setdefault("_mcp_sessions", {})


async def _session(server: MCPServer, env: Any) -> Any:
    """The episode's live session on `server` (started now if it has none, or its server died)."""
    sessions = _sessions(env)
    live = sessions.get(server)
    if live is None or not live.current():
        if live is not None:
            await live.close()
        live = sessions[server] = _Session(server, env, env.state, _episode_sandbox(env, server))
    return await live.ready


def _episode_sandbox(env: Any, server: MCPServer) -> Any:
    """The sandbox a stdio server of this episode runs in (None: on this host, no sandbox)."""
    lease = getattr(env, "sandbox", None)
    if server.url is not None or lease is None:
        return None
    return getattr(lease, "sandbox", lease)  # a pool's Lease wraps the sandbox itself


async def close_sessions(env: Any) -> None:
    """Stop every MCP server session `env` holds (the episode watcher does this by itself too)."""
    for live in list(_sessions(env).values()):
        await live.close()
    _sessions(env).clear()


def _describe(e: BaseException) -> str:
    while getattr(e, "exceptions", None):  # an exception group (anyio task groups) wraps the real error
        e = e.exceptions[0]  # type: ignore[attr-defined]
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _field(obj: Any, snake: str) -> Any:
    """A field of an mcp type: snake_case in mcp 2, camelCase in mcp 1."""
    if hasattr(obj, snake):
        return getattr(obj, snake)
    head, *rest = snake.split("_")
    return getattr(obj, head + "".join(w.title() for w in rest), None)


def _result_text(result: Any) -> str:
    parts = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        parts.append(text if text is not None else f"[{getattr(block, 'type', 'content')} content]")
    structured = _field(result, "structured_content")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, default=str))
    return "\n".join(parts)


def mcp_tools(target: str | Sequence[str], *, include: Sequence[str] | None = None, prefix: str = "",
              timeout_s: float = DEFAULT_TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S,
              env: dict[str, str] | None = None, cwd: str | None = None,
              ro_binds: Sequence[str] | None = None) -> tuple[Tool, ...]:
    """The tools of an MCP server: `target` is a stdio command line ("python -m my_server", or an
    argv list) or a streamable-HTTP URL. `include` keeps only the named tools; `prefix` is put
    before each name (two servers with a tool of the same name); `timeout_s` bounds each call and
    `start_timeout_s` a server's start (and the listing); `ro_binds` are the host paths a server
    in a sandbox sees (see the module's doc)."""
    server = MCPServer.parse(target, env=env, cwd=cwd, ro_binds=ro_binds)
    listed = list(list_tools(server, start_timeout_s))
    if include is not None:
        unknown = sorted(set(include) - {t["name"] for t in listed})
        if unknown:
            raise MCPError(f"MCP server `{server}` has no tool {', '.join(unknown)}; it has: "
                           f"{', '.join(t['name'] for t in listed)}")
        listed = [t for t in listed if t["name"] in include]
    return tuple(_make_tool(server, t, prefix, timeout_s, start_timeout_s) for t in listed)


def _make_tool(server: MCPServer, spec: dict[str, Any], prefix: str, timeout_s: float,
               start_timeout_s: float) -> Tool:
    remote_name = spec["name"]

    async def call(env: Any, **arguments: Any) -> ToolResult:
        try:
            session = await asyncio.wait_for(_session(server, env), start_timeout_s)
        except Exception as e:
            return ToolResult(error=f"MCP server `{server}` did not start: {_describe(e)}")
        try:
            result = await asyncio.wait_for(session.call_tool(remote_name, arguments), timeout_s)
        except Exception as e:
            # Crashed or hung: this episode gets a fresh server at its next call.
            broken = _sessions(env).pop(server, None)
            if broken is not None:
                await broken.close()
            reason = f"timed out after {timeout_s:g} s" if isinstance(e, asyncio.TimeoutError) else _describe(e)
            return ToolResult(error=f"MCP tool '{remote_name}' failed ({reason}); its server was restarted")
        text = _result_text(result)
        if _field(result, "is_error"):
            return ToolResult(error=text or f"MCP tool '{remote_name}' reported an error")
        return ToolResult(output=text)

    return schema_tool(prefix + remote_name, spec["description"] or remote_name, spec["inputSchema"] or {},
                       call, timeout=start_timeout_s + timeout_s + 5.0, inject=("env",))


__all__ = ["MCPError", "MCPServer", "close_sessions", "list_tools", "mcp_tools"]
