"""The Sandbox protocol over an in-sandbox agent (`agent.py`), shared by every backend.

A backend only says how to start the agent and how to tear the sandbox down (`_launch`,
`_teardown`); everything else (exec, files, reset, health) is one JSON request to the agent. File
operations run *inside* the sandbox, as the sandboxed user, so a symlink planted by sandboxed code
can never make the host read or write a host file.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import functools
import io
import itertools
import json
import os
import secrets
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from .base import ExecResult
from .common import (
    FAULT_TIMEOUT,
    KILLED_EXIT,
    WORKDIR,
    Limits,
    SandboxDead,
    SandboxError,
    inside_path,
    to_bytes,
    truncation_marker,
)

T = TypeVar("T")

AGENT_SOURCE = Path(__file__).with_name("agent.py").read_text()
# The agent's source travels as the first line on its stdin (not on the command line, where `ps`
# would show all of it); the last argument only names the process.
AGENT_ARGS = ("-I", "-u", "-c", "import sys, json; exec(json.loads(sys.stdin.buffer.readline()))",
              "agentrl-sandbox-agent")
HOST_GRACE_S = 10.0  # how long past a command's own timeout the host waits for the agent's answer
FILE_CAP = 64 * 2**20  # read_file / download move at most this much through the agent
FILE_TIMEOUT_S = 120.0
LINE_SLACK = 2**20  # bytes an answer may carry beyond its base64 output (fields, error text)


def max_line(cap: int) -> int:
    """The longest answer line an exec with output cap `cap` can produce: both streams in base64."""
    return 2 * (4 * cap // 3 + 4) + LINE_SLACK


@functools.cache
def executor() -> ThreadPoolExecutor:
    """Threads for blocking work (process and container start-up, SDK calls), off the event loop."""
    return ThreadPoolExecutor(max_workers=64, thread_name_prefix="agentrl-sandbox")


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(executor(), functools.partial(fn, *args, **kwargs))


class AgentChannel:
    """Requests to an agent; one reader thread routes the answers to their futures by id.
    concurrent.futures (not asyncio) futures, so any event loop or thread can wait on them.

    Every answer must carry the token sent at boot (only the agent we started read it), and no
    line may be longer than the largest answer a pending request allows: anything else ends the
    channel with a clear reason instead of growing host memory."""

    def __init__(self, send: Callable[[bytes], None], chunks: Iterator[bytes], close: Callable[[], None],
                 restore: bool = True) -> None:
        self._send, self._chunks, self._close = send, chunks, close
        self._ids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future[dict[str, Any]]] = {}
        self._limits: dict[int, int] = {}  # request id -> longest answer line it allows
        self._send_lock = threading.Lock()
        self._token = secrets.token_hex(16)
        self.dead: str | None = None
        threading.Thread(target=self._read_loop, daemon=True, name="agentrl-sandbox-agent").start()
        try:  # boot the agent (see AGENT_ARGS), then tell it its token
            boot = json.dumps({"token": self._token, "restore": restore})
            self._send((json.dumps(AGENT_SOURCE) + "\n" + boot + "\n").encode())
        except (OSError, ValueError) as e:
            self.fail(f"sending the agent its code failed: {e}")

    def request(self, op: str, **fields: Any) -> concurrent.futures.Future[dict[str, Any]]:
        fut: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        if self.dead:
            fut.set_exception(SandboxDead(f"sandbox agent is gone: {self.dead}"))
            return fut
        rid = next(self._ids)
        self._limits[rid] = max_line(int(fields.get("cap") or 0))
        self._pending[rid] = fut
        line = (json.dumps({"id": rid, "op": op, **fields}) + "\n").encode()
        try:
            with self._send_lock:
                self._send(line)
        except (OSError, ValueError) as e:
            self.fail(f"sending to the agent failed: {e}")
        return fut

    def _line_limit(self) -> int:
        return max(list(self._limits.values()), default=LINE_SLACK)

    def _read_loop(self) -> None:
        buf = bytearray()
        try:
            for chunk in self._chunks:
                start = len(buf)
                buf += chunk
                while (end := buf.find(b"\n", start)) >= 0:
                    line = bytes(buf[:end])
                    del buf[:end + 1]
                    start = 0
                    if not self._deliver(line):
                        return
                if len(buf) > self._line_limit():
                    self.fail(f"the agent sent a line over {self._line_limit()} bytes without a newline; "
                              "the channel is closed (flood or impostor)")
                    return
        except Exception as e:
            self.fail(f"reading from the agent failed: {e!r}")
            return
        self.fail("the agent closed its output (sandbox stopped?)")

    def _deliver(self, line: bytes) -> bool:
        """Route one answer; False (and the channel is dead) when it is not a valid answer."""
        try:
            message = json.loads(line)
        except ValueError:
            self.fail(f"the agent sent a line that is not JSON ({line[:80]!r}...)")
            return False
        if not isinstance(message, dict) or message.get("t") != self._token:
            self.fail("an answer without the agent's token arrived: something else writes to the channel")
            return False
        self._limits.pop(message.get("id"), None)  # type: ignore[arg-type]
        fut = self._pending.pop(message.get("id"), None)  # type: ignore[arg-type]
        if fut is None or fut.done():
            return True
        if "error" in message:
            fut.set_exception(SandboxError(f"sandbox agent error: {message['error']}"))
        else:
            fut.set_result(message)
        return True

    def fail(self, why: str) -> None:
        self.dead = self.dead or why
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(SandboxDead(f"sandbox agent is gone: {self.dead}"))
        self._pending.clear()
        self._limits.clear()

    def close(self) -> None:
        self.fail("channel closed")
        self._close()


class AgentSandbox:
    """Base class: the Sandbox protocol, given a backend's `_launch()` and `_teardown()`."""

    kill_all_on_reset = True  # the sandbox has its own pid namespace
    # Niceness of the commands, above the agent's: in a sandbox with a CPU cgroup of its own (docker)
    # a fork bomb's hundred spinning processes would otherwise starve the agent that must time them
    # out. 0 where niceness would reach beyond the sandbox (bubblewrap shares the host's scheduler).
    command_nice = 0
    wipe_on_reset: tuple[str, ...] = (WORKDIR, "/tmp")

    def __init__(self, limits: Limits | None = None, path: str = "/usr/local/bin:/usr/bin:/bin") -> None:
        self.limits = limits or Limits()
        self.base_env = {"PATH": path, "HOME": WORKDIR, "LANG": "C.UTF-8", "TERM": "dumb"}
        self._channel: AgentChannel | None = None
        self._start_lock = threading.Lock()  # a thread lock: start() may be awaited from several loops
        self._closed = False

    # -- backend hooks ----------------------------------------------------------------------------

    def _launch(self) -> AgentChannel:
        """Start the sandbox and its agent (blocking; runs on a worker thread)."""
        raise NotImplementedError

    def _teardown(self) -> None:
        """Destroy the sandbox after its channel is closed (blocking; idempotent)."""
        raise NotImplementedError

    def _kill(self) -> None:
        """SIGKILL the running sandbox from the host, leaving the clean-up to close() (blocking)."""
        raise NotImplementedError

    def _command(self, argv: list[str], timeout: float) -> list[str]:
        """The command the agent runs for `argv` (backends add per-exec limits here)."""
        return argv

    def _inside(self, path: str) -> str:
        """A caller's path as the sandboxed processes see it."""
        return inside_path(path)

    def spawn_argv(self, argv: list[str], *, env: dict[str, str] | None = None,
                   ro_binds: tuple[str, ...] = (), cwd: str = WORKDIR) -> list[str]:
        """A host command line that runs `argv` as a long-lived process inside this (started)
        sandbox, talking over its stdin/stdout (an MCP stdio server): the sandbox's files, network
        and limits, its `base_env` plus `env`, and the host paths `ro_binds` shown read-only at the
        same paths (its interpreter and code). The process dies with the sandbox."""
        raise NotImplementedError(f"the {type(self).__name__} backend cannot start a long-lived process "
                                  "inside its sandboxes; use the local (bubblewrap) backend")

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the sandbox now (otherwise the first call does). Idempotent."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        if self._channel is None:
            await in_thread(self._ensure_started)

    def _ensure_started(self) -> None:
        with self._start_lock:
            if self._channel is None and not self._closed:
                self._channel = self._launch()

    async def close(self) -> None:
        """Kill everything in the sandbox and remove it (idempotent)."""
        self._closed = True
        await in_thread(self._close_sync)

    def _close_sync(self) -> None:
        with self._start_lock:  # waits for a start in flight, so nothing it made can leak
            channel, self._channel = self._channel, None
            if channel is not None:
                channel.close()
            self._teardown()

    async def kill(self) -> None:
        """Kill the sandbox from the host as an OOM killer or an operator would, without closing it:
        what a pool must survive (fault drills, tests). Later calls raise SandboxDead."""
        channel = self._channel
        if channel is not None:
            await in_thread(self._kill)
            channel.fail("the sandbox was killed from the host")

    @property
    def alive(self) -> bool:
        """Whether the sandbox can still serve calls, as far as known without asking (not closed,
        and its agent's channel not dead); `healthy()` asks."""
        return not self._closed and (self._channel is None or self._channel.dead is None)

    async def reset(self) -> None:
        """Kill every process and empty the work dir (and /tmp)."""
        if self._closed:
            raise SandboxError("sandbox is closed")
        if self._channel is not None:
            await self._ask("reset", 30.0, wipe=list(self.wipe_on_reset), kill_all=self.kill_all_on_reset)

    async def healthy(self) -> bool:
        """Whether the agent answers (so the sandbox is alive and can serve execs)."""
        if self._closed or self._channel is None or self._channel.dead:
            return False
        try:
            await self._ask("ping", 10.0)
        except SandboxError:
            return False
        return True

    async def _ask(self, op: str, wait_s: float, **fields: Any) -> dict[str, Any]:
        await self.start()
        channel = self._channel
        if channel is None:
            raise SandboxError("sandbox is closed")
        fut = channel.request(op, **fields)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), wait_s)
        except asyncio.TimeoutError:
            channel.fail(f"no answer to {op!r} within {wait_s:.0f} s")  # wedged: a pool replaces it
            raise SandboxError(f"the agent of {self!r} did not answer {op!r} within {wait_s:.0f} s") from None

    # -- exec -------------------------------------------------------------------------------------

    async def exec(self, cmd: str | list[str], timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | bytes | None = None) -> ExecResult:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise SandboxError("empty command")
        out, err, answer, seconds = await self._run(argv, timeout, cwd, env, stdin)
        return ExecResult(stdout=_text(out, answer["out_omitted"]), stderr=_text(err, answer["err_omitted"]),
                          exit_code=answer["exit_code"], timed_out=answer["timed_out"],
                          truncated=bool(answer["out_omitted"] or answer["err_omitted"]), seconds=seconds,
                          fault=answer.get("fault"))

    async def _run(self, argv: list[str], timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | bytes | None = None,
                   cap: int | None = None) -> tuple[bytes, bytes, dict[str, Any], float]:
        """Run argv through the agent: (stdout bytes, stderr bytes, the agent's answer, seconds)."""
        timeout = self.limits.timeout_s if timeout is None else float(timeout)
        if timeout <= 0:
            raise SandboxError(f"exec timeout must be > 0, got {timeout}")
        data = None if stdin is None else base64.b64encode(to_bytes(stdin)).decode()
        start = time.perf_counter()
        try:
            answer = await self._ask(
                "exec", timeout + HOST_GRACE_S, argv=self._command(argv, timeout),
                cwd=self._inside(cwd) if cwd else self._inside(WORKDIR), env={**self.base_env, **(env or {})},
                stdin=data, timeout=timeout, cap=cap or self.limits.max_output_bytes,
                # the process count is the sandbox's own only in a pid namespace of its own
                pids=self.limits.pids if self.kill_all_on_reset else None, watch=list(self.wipe_on_reset),
                nice=self.command_nice)
        except SandboxDead as e:
            raise SandboxDead(f"exec in {self!r} failed: {e}") from e
        except SandboxError as e:
            if "did not answer" in str(e):  # reported like any timeout; the sandbox is now unhealthy
                answer = {"stdout": "", "stderr": base64.b64encode(str(e).encode()).decode(), "out_omitted": 0,
                          "err_omitted": 0, "exit_code": KILLED_EXIT, "timed_out": True, "fault": FAULT_TIMEOUT}
            else:
                raise SandboxError(f"exec in {self!r} failed: {e}") from e
        seconds = time.perf_counter() - start
        return base64.b64decode(answer["stdout"]), base64.b64decode(answer["stderr"]), answer, seconds

    # -- files (all through the agent, as the sandboxed user) -------------------------------------

    async def write_file(self, path: str, content: str | bytes) -> None:
        full = self._inside(path)
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        _, err, answer, _ = await self._run(["/bin/sh", "-c", script, "sh", full], FILE_TIMEOUT_S,
                                            stdin=to_bytes(content))
        if answer["exit_code"] != 0:
            raise SandboxError(f"write_file({path!r}) failed: {err.decode(errors='replace').strip()}")

    async def read_file(self, path: str) -> bytes:
        full = self._inside(path)
        script = 'if [ -d "$1" ]; then echo "is a directory" >&2; exit 21; fi; exec cat -- "$1"'
        out, _, answer, _ = await self._run(["/bin/sh", "-c", script, "sh", full], FILE_TIMEOUT_S, cap=FILE_CAP)
        if answer["exit_code"] == 21:
            raise SandboxError(f"{path} is a directory, not a file")
        if answer["exit_code"] != 0:
            raise FileNotFoundError(f"no such file in sandbox (or not readable there): {path}")
        if answer["out_omitted"]:
            raise SandboxError(f"{path} is larger than {FILE_CAP} bytes; use download()")
        return out

    async def upload(self, local_path: str, remote_path: str) -> None:
        """Copy a host file or directory tree into the sandbox (as a tar through the agent)."""
        src = Path(local_path)
        if not src.exists():
            raise FileNotFoundError(f"upload source does not exist: {local_path}")
        parent, name = os.path.split(self._inside(remote_path))

        def pack() -> bytes:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(src, arcname=name)
            return buf.getvalue()

        script = 'mkdir -p -- "$1" && exec tar -x --no-same-owner -C "$1"'
        _, err, answer, _ = await self._run(["/bin/sh", "-c", script, "sh", parent], FILE_TIMEOUT_S,
                                            stdin=await in_thread(pack))
        if answer["exit_code"] != 0:
            raise SandboxError(f"upload to {remote_path} failed: {err.decode(errors='replace').strip()}")

    async def download(self, remote_path: str, local_path: str) -> None:
        """Copy a sandbox file or directory tree to the host (a tar through the agent)."""
        parent, name = os.path.split(self._inside(remote_path))
        out, err, answer, _ = await self._run(["tar", "-c", "-C", parent, "--", name], FILE_TIMEOUT_S, cap=FILE_CAP)
        if answer["exit_code"] != 0:
            raise FileNotFoundError(f"no such path in sandbox: {remote_path} ({err.decode(errors='replace').strip()})")
        if answer["out_omitted"]:
            raise SandboxError(f"{remote_path} is larger than {FILE_CAP} bytes as a tar")
        await in_thread(_unpack, out, name, Path(local_path))


def _text(data: bytes, omitted: int) -> str:
    text = data.decode("utf-8", errors="replace")
    return text + truncation_marker(omitted) if omitted else text


def _unpack(blob: bytes, name: str, dst: Path) -> None:
    """Extract the tar of `name` so that `name` itself lands at `dst`."""
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        members = tar.getmembers()
        if len(members) == 1 and members[0].isfile():
            dst.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(members[0]) as f:  # type: ignore[union-attr]
                dst.write_bytes(f.read())
            return
        dst.mkdir(parents=True, exist_ok=True)
        kept = []
        for m in members:  # re-root the tree at dst
            rel = os.path.relpath(m.name, name)
            if rel != "." and not rel.startswith(".."):
                m.name = rel
                kept.append(m)
        tar.extractall(dst, members=kept, filter="data")
