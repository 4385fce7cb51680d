"""MCP tools in any ToolEnv (issue 53) against a real stdio server written with the `mcp` package
(tests/interop/fixtures/mcp_server.py): schemas from `tools/list`, calls through `tools/call`,
a server per episode stopped with it, every server failure an observation, a server inside the
episode's bubblewrap sandbox in an env that has one, and `env.mcp_servers` in config. The env check
and two training steps go through the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

import agentrl
from agentrl.config import load_config
from agentrl.parsing import ToolCall
from tests.support.interop import TINY, run_cli

pytest.importorskip("mcp")  # CI installs .[interop]; AGENTRL_REQUIRE_ALL fails the skip

from agentrl.tools import submit
from agentrl.tools.mcp import MCPError, mcp_tools

FIXTURES = Path(__file__).parent / "fixtures"
SERVER = [sys.executable, str(FIXTURES / "mcp_server.py")]
ENV_SPEC = f"{FIXTURES / 'mcp_env.py'}:MCPAddEnv"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def _pids(pid_file: Path) -> list[int]:
    return [int(p) for p in pid_file.read_text().split()] if pid_file.exists() else []


def _survivors(pids: list[int], wait_s: float = 15.0) -> list[int]:
    """The servers still alive after `wait_s` (mcp gives a server 2 s to exit on EOF, then ends it)."""
    deadline = time.monotonic() + wait_s
    while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


@pytest.fixture
def pid_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every fixture server started from here writes its pid to this file (it inherits our env)."""
    path = tmp_path / "mcp_pids"
    monkeypatch.setenv("MCP_PID_FILE", str(path))
    return path


class AllTools(agentrl.ToolEnv):
    tools = (*mcp_tools(SERVER, timeout_s=8.0), submit)
    max_turns = 8

    def tasks(self, split: str = "train") -> list[dict]:
        return [{"id": "t0", "prompt": "Use the tools."}]

    async def reward(self, task: dict, state: dict) -> float:
        return 0.0


def _call(env: agentrl.ToolEnv, name: str, **arguments: object) -> str:
    return env.tool_parser.format_call(ToolCall(name, arguments))


def test_tools_come_from_tools_list_with_their_schemas() -> None:
    names = {t.name: t for t in AllTools.tools}
    assert set(names) == {"add", "count", "fail", "hang", "crash", "write", "connect", "submit"}
    add = names["add"]
    assert add.description == "Add two integers and return the sum."
    assert add.parameters["properties"]["a"]["type"] == "integer" and add.parameters["required"] == ["a", "b"]
    with pytest.raises(MCPError, match="has no tool nope; it has: add, count"):
        mcp_tools(SERVER, include=["add", "nope"])
    with pytest.raises(MCPError, match="did not list its tools"):
        mcp_tools([sys.executable, "-c", "raise SystemExit(1)"], start_timeout_s=30)


def test_a_server_per_episode_and_every_failure_is_an_observation(pid_file: Path) -> None:
    env = AllTools()

    async def play() -> None:
        for episode in range(2):
            await env.areset(env.tasks()[0])
            result = await env.astep(_call(env, "count"))
            assert result.observation[0]["content"] == "1"  # a fresh server each episode
            result = await env.astep(_call(env, "count"))
            assert result.observation[0]["content"] == "2"  # the same server within it
            if episode == 0:
                result = await env.astep(_call(env, "add", a=2, b="x"))  # the schema says integer
                assert "invalid arguments at 'b'" in result.observation[0]["content"]
                result = await env.astep(_call(env, "fail", reason="because"))  # isError result
                assert "failed on purpose: because" in result.observation[0]["content"]
                assert "Error:" in result.observation[0]["content"]
                result = await env.astep(_call(env, "crash"))  # the server dies mid-call
                assert "MCP tool 'crash' failed" in result.observation[0]["content"]
                result = await env.astep(_call(env, "add", a=2, b=3))  # a new server answers
                assert result.observation[0]["content"] == "5"
                result = await env.astep(_call(env, "hang"))  # past the tool's 8 s
                assert "MCP tool 'hang' failed (timed out after 8 s)" in result.observation[0]["content"]
                result = await env.astep(_call(env, "add", a=1, b=1))
                assert result.observation[0]["content"] == "2" and not result.terminated
            else:
                result = await env.astep(_call(env, "submit", answer="done"))
                assert result.terminated
        await asyncio.sleep(0.5)  # the episode watcher begins stopping the last server within 0.1 s
        await env.aclose()

    asyncio.run(play())
    pids = _pids(pid_file)
    assert len(pids) == 4  # episode 0: first, after the crash, after the hang; episode 1: one
    assert not _survivors(pids)  # none outlives its episode


TAG = f"agentrl-mcp-test-{uuid.uuid4().hex}"  # on the sandboxed servers' command lines, to find their processes


class SandboxedTools(agentrl.ToolEnv):
    tools = (*mcp_tools([*SERVER, TAG], timeout_s=20.0), submit)
    needs_sandbox = True  # the local (bubblewrap) backend by default: the server runs in the episode's sandbox
    max_turns = 8

    def tasks(self, split: str = "train") -> list[dict]:
        return [{"id": "t0", "prompt": "Use the tools."}]

    async def reward(self, task: dict, state: dict) -> float:
        return 0.0


def _tagged_processes() -> list[int]:
    """Host pids whose command line has TAG (a sandboxed server, and the launcher that entered it)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if TAG.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:  # gone meanwhile
            continue
    return [p for p in pids if p != os.getpid()]


def test_a_stdio_server_runs_inside_the_episodes_sandbox(tmp_path: Path) -> None:
    env = SandboxedTools()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.setblocking(False)
    # its own code is read-only, the host's dirs are not there, the root is read-only
    outside = {FIXTURES / f"escape-{TAG}.txt": "Read-only file system", tmp_path / "escape.txt": "No such file",
               Path("/escape.txt"): "Read-only file system"}

    async def play() -> list[int]:
        await env.areset(env.tasks()[0])
        result = await env.astep(_call(env, "write", path="made_by_server.txt", text="hello"))
        assert result.observation[0]["content"] == "/work/made_by_server.txt"  # its cwd is the sandbox's /work
        assert await env.sandbox.read_file("/work/made_by_server.txt") == b"hello"  # and the sandbox sees it
        running = _tagged_processes()
        for path, why in outside.items():
            result = await env.astep(_call(env, "write", path=str(path), text="escaped"))
            assert why in result.observation[0]["content"], result.observation
        result = await env.astep(_call(env, "connect", port=port))  # the sandbox's own loopback: nobody listens
        assert "Connection refused" in result.observation[0]["content"], result.observation
        result = await env.astep(_call(env, "count"))
        assert result.observation[0]["content"] == "1"  # the same server answered every call
        result = await env.astep(_call(env, "submit", answer="done"))
        assert result.terminated
        await asyncio.sleep(0.5)  # the episode watcher begins stopping the server within 0.1 s
        await env.aclose()
        return running

    try:
        running = asyncio.run(play())
    finally:
        env.close()
    assert running  # the launcher and the server, while the episode ran
    assert not [p for p in outside if p.exists()]
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing connected
    listener.close()
    assert not _survivors(running)  # none outlives its episode
    assert not _tagged_processes()


def test_a_backend_that_cannot_host_a_server_says_so_in_one_line() -> None:
    from agentrl.config import SandboxConfig

    env = SandboxedTools(sandbox_config=SandboxConfig(backend="process"))

    async def play() -> str:
        await env.areset(env.tasks()[0])
        result = await env.astep(_call(env, "count"))
        await env.aclose()
        return result.observation[0]["content"]

    try:
        content = asyncio.run(play())
    finally:
        env.close()
    assert "did not start: NotImplementedError: the process backend has no sandbox" in content
    assert "use the local (bubblewrap) backend" in content and "Traceback" not in content


def test_env_mcp_servers_in_config_add_the_tools_to_a_tool_env(pid_file: Path) -> None:
    from agentrl.env_builder import make_env  # what `agentrl train` builds each episode's env with

    server = " ".join(SERVER)
    cfg = load_config(f"{FIXTURES / 'mcp_env.py'}:AskEnv", overrides=[f"env.mcp_servers={json.dumps([server])}"])
    assert cfg.env.mcp_servers == [server]
    env = make_env(cfg, None)
    try:
        assert [t.name for t in env.tools] == ["submit", "add", "count", "fail", "hang", "crash", "write", "connect"]
        env.reset(options={"task": env.tasks()[0]})
        observation, *_ = env.step(_call(env, "add", a=20, b=22))
        assert observation[0]["content"] == "42"
    finally:
        env.close()
    assert len(_pids(pid_file)) == 1 and not _survivors(_pids(pid_file))
    cfg = load_config("examples/my_env.py:AddEnv", overrides=[f"env.mcp_servers={json.dumps([server])}"])
    with pytest.raises(ValueError, match="duplicate names: \\['add'\\]"):  # AddEnv has an add of its own
        make_env(cfg, None)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # minutes on an idle 2-core CPU (the model trains); a loaded one takes several times that
def test_env_check_and_train_through_the_cli_leave_no_server(tmp_path: Path, pid_file: Path) -> None:
    out = run_cli("env", "check", ENV_SPEC, env={**os.environ})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK:" in out.stdout
    out = run_cli("train", "--env", ENV_SPEC, "trainer.steps=2", f"run.dir={tmp_path}", "run.name=mcp",
                  "env.max_turns=2", "rollout.trajectory_timeout_s=1200", *TINY, env={**os.environ}, timeout=1400)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "mcp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and sum(r["policy_tokens"] for r in rows) > 0
    assert (tmp_path / "mcp" / "trajectories.jsonl").read_text().strip()
    pids = _pids(pid_file)
    assert pids  # the listing at import started one at least
    assert not _survivors(pids)
