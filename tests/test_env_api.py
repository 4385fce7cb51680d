"""Env / ToolEnv: the episode loop, every bad-input case as an observation, rewards, sandbox
handling, the registry and the Gymnasium facade."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium
import pytest

import agentrl
from agentrl.env import (
    EnvError,
    EpisodeOverError,
    TextSpace,
    ToolEnv,
    load_entry_point,
    make,
    register,
    registry,
)
from agentrl.parsing import ToolCall, get_parser
from agentrl.sandboxes.base import ExecResult, Sandbox
from agentrl.tools import bash, python, str_replace_editor, submit, tool

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# a test env and an in-memory sandbox (the logic tests; real bwrap runs at the end)
# ---------------------------------------------------------------------------------------------


class MemorySandbox:
    """Implements the Sandbox protocol over a dict; exec understands only `cat PATH`."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.closed = False

    async def exec(self, cmd: str | list[str], timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | bytes | None = None) -> ExecResult:
        argv = cmd.split() if isinstance(cmd, str) else cmd
        if argv[:1] == ["cat"] and argv[1] in self.files:
            return ExecResult(self.files[argv[1]].decode(), "", 0)
        return ExecResult("", f"cannot run {argv}", 127)

    async def write_file(self, path: str, content: str | bytes) -> None:
        self.files[path] = content.encode() if isinstance(content, str) else content

    async def read_file(self, path: str) -> bytes:
        return self.files[path]

    async def upload(self, local_path: str, remote_path: str) -> None:
        self.files[remote_path] = Path(local_path).read_bytes()

    async def download(self, remote_path: str, local_path: str) -> None:
        Path(local_path).write_bytes(self.files[remote_path])

    async def reset(self) -> None:
        self.files.clear()

    async def close(self) -> None:
        self.closed = True


class CountingPool:
    def __init__(self) -> None:
        self.made: list[MemorySandbox] = []
        self.idle: list[MemorySandbox] = []
        self.out = 0

    async def get(self) -> MemorySandbox:
        if not self.idle:
            self.made.append(MemorySandbox())
            self.idle.append(self.made[-1])
        self.out += 1
        return self.idle.pop()

    async def put(self, sb: MemorySandbox) -> None:
        self.out -= 1
        await sb.reset()
        self.idle.append(sb)


@tool(inject=("sandbox",))
async def note(text: str, sandbox: Any) -> str:
    """Write a note into the sandbox.

    Args:
        text: what to write
    """
    await sandbox.write_file("note.txt", text)
    return f"wrote {len(text)} chars"


@tool
def shout(text: str, times: int = 1) -> str:
    """Repeat text loudly.

    Args:
        text: the text
        times: how often
    """
    return (text.upper() + " ") * times


@tool
def crash() -> str:
    """Always fails."""
    raise RuntimeError("disk on fire")


@tool(timeout=0.2)
async def hang() -> str:
    """Never finishes."""
    await asyncio.sleep(30)
    return ""


class NoteEnv(ToolEnv):
    tools = (note, shout, crash, hang, submit)
    max_turns = 5
    max_output_chars = 40
    needs_sandbox = True

    def tasks(self, split: str = "train") -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}", "word": w} for i, w in enumerate(["apple", "pear", "plum"])]

    def user_prompt(self, task: dict[str, Any]) -> str:
        return f"Write the word {task['word']} into a note, then submit."

    async def reward(self, task: dict[str, Any], state: Any) -> dict[str, float]:
        written = (await self.sandbox.exec(["cat", "note.txt"])).stdout
        return {"reward": float(written == task["word"]) + 0.5 * float(state.get("answer") == "done"),
                "wrote": float(written == task["word"])}


def call(name: str, **arguments: Any) -> str:
    return get_parser("hermes").format_call(ToolCall(name, arguments))


@pytest.fixture
def pool() -> CountingPool:
    return CountingPool()


@pytest.fixture
async def env(pool: CountingPool) -> Any:
    e = NoteEnv(sandbox_pool=pool)
    await e.areset({"id": "t", "word": "apple"})
    yield e
    await e.aclose()


# ---------------------------------------------------------------------------------------------
# the episode
# ---------------------------------------------------------------------------------------------


async def test_reset_gives_system_and_user_messages(pool: CountingPool) -> None:
    env = NoteEnv(sandbox_pool=pool)
    messages = await env.areset({"id": "x", "word": "plum"})
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"] == "Write the word plum into a note, then submit."
    system = messages[0]["content"]
    assert "<tools>" in system and json.dumps(shout.spec()) in system
    assert list(note.parameters["properties"]) == ["text"]  # the injected sandbox is hidden
    assert pool.out == 1 and isinstance(env.sandbox, MemorySandbox) and isinstance(env.sandbox, Sandbox)
    await env.aclose()
    assert pool.out == 0 and env.sandbox is None


async def test_a_full_episode_with_submit(env: NoteEnv) -> None:
    r1 = await env.astep("I'll write it.\n" + call("note", text="apple"))
    assert r1.observation == [{"role": "tool", "name": "note", "content": "wrote 5 chars"}]
    assert r1.info["step_rewards"] == {"valid_call": 0.01, "tool_ok": 0.01} and r1.reward == 0.02  # α = 0.01
    assert not r1.terminated and not r1.truncated and "outcome_reward" not in r1.info
    r2 = await env.astep(call("submit", answer="done") + call("note", text="overwritten after submit"))
    assert r2.terminated and not r2.truncated
    assert r2.info["outcome_reward"] == 1.5
    assert r2.info["reward_components"] == {"reward": 1.5, "wrote": 1.0}
    assert r2.info["ended_by"] == "submit"
    assert [m["name"] for m in r2.observation] == ["submit"]  # calls after a submit do not run
    assert env.sandbox.files["note.txt"] == b"apple"


async def test_no_tool_call_is_an_observation_and_a_turn(env: NoteEnv) -> None:
    result = await env.astep("I think the answer is apple.")
    (message,) = result.observation
    assert message["role"] == "user" and message["content"].startswith("No tool call found")
    assert call("note", text="...") in message["content"]  # shows how to call a tool
    assert result.info["step_rewards"] == {"valid_call": 0.0, "tool_ok": 0.0} and result.reward == 0.0
    assert env.turn == 1


@pytest.mark.parametrize(("action", "expected"), [
    ("<tool_call>{not json}</tool_call>", "Your tool call could not be parsed:\n- the JSON in <tool_call> is invalid"),
    ('<tool_call>{"name": "note", "arguments": {"text": "x"}}', "is not closed with </tool_call>"),
    (call("teleport", to="mars"), "Error: unknown tool 'teleport'; available tools: note, shout, crash, hang, submit"),
    (call("shout", text="hi", times="lots"), "Error: argument 'times' must be integer, got str 'lots'"),
    (call("shout"), "Error: tool 'shout' is missing required argument 'text'"),
    (call("shout", text="hi", loud=True), "Error: tool 'shout' has no argument 'loud'; it takes: text, times"),
    (call("crash"), "Error: tool 'crash' raised RuntimeError: disk on fire"),
    (call("hang"), "Error: tool 'hang' timed out after 0.2 s"),
])
async def test_bad_input_becomes_a_readable_observation(env: NoteEnv, action: str, expected: str) -> None:
    result = await env.astep(action)
    text = "\n".join(m["content"] for m in result.observation)
    assert expected in text
    assert not result.terminated and result.info["step_rewards"]["tool_ok"] == 0.0


async def test_valid_call_to_a_failing_tool_scores_valid_but_not_ok(pool: CountingPool) -> None:
    env = NoteEnv(sandbox_pool=pool, step_reward_alpha=0.5)
    await env.areset({"id": "t", "word": "w"})
    result = await env.astep(call("crash"))
    assert result.info["step_rewards"] == {"valid_call": 0.5, "tool_ok": 0.0} and result.reward == 0.5
    assert result.info["num_tool_errors"] == 1 and result.info["tool_calls"][0]["error"].startswith("tool 'crash'")


async def test_oversize_output_is_truncated_with_a_marker(env: NoteEnv) -> None:
    result = await env.astep(call("shout", text="abcdefghij", times=20))
    full = "ABCDEFGHIJ " * 20  # 220 chars; the env's limit is 40: 26 of head, 14 of tail
    assert result.observation[0]["content"] == f"{full[:26]}\n[... truncated 180 chars ...]\n{full[-14:]}"


async def test_max_turns_truncates_and_still_scores(env: NoteEnv) -> None:
    await env.astep(call("note", text="apple"))
    for _ in range(3):
        assert not (await env.astep("thinking...")).truncated
    last = await env.astep("still thinking")
    assert last.truncated and not last.terminated
    assert last.info["outcome_reward"] == 1.0 and last.info["ended_by"] == "max_turns"


async def test_stepping_a_finished_env_raises(env: NoteEnv, pool: CountingPool) -> None:
    await env.astep(call("submit"))
    with pytest.raises(EpisodeOverError, match=r"the episode is over .*call reset"):
        await env.astep(call("shout", text="again"))
    fresh = NoteEnv(sandbox_pool=pool)
    with pytest.raises(EpisodeOverError, match=r"call reset"):
        await fresh.astep("hello")
    await env.areset({"id": "a", "word": "x"})
    with pytest.raises(TypeError, match=r"must be the assistant's text"):
        await env.astep(["not", "text"])  # type: ignore[arg-type]


async def test_bad_tasks_are_refused(pool: CountingPool) -> None:
    env = NoteEnv(sandbox_pool=pool)
    with pytest.raises(ValueError, match=r"a task must be a dict with an 'id' key"):
        await env.areset({"word": "apple"})


# ---------------------------------------------------------------------------------------------
# bugs in the env's own code → EnvError
# ---------------------------------------------------------------------------------------------


class BuggyEnv(NoteEnv):
    mode = "raise"

    async def reward(self, task: dict[str, Any], state: Any) -> Any:
        if self.mode == "raise":
            return {}["missing"]
        if self.mode == "dict":
            return {"score": 1.0}
        if self.mode == "nan":
            return float("nan")
        return "high"


@pytest.mark.parametrize(("mode", "message"), [
    ("raise", "BuggyEnv.reward raised KeyError: 'missing'"),
    ("dict", "returned a dict without 'reward'"),
    ("nan", "non-finite reward"),
    ("str", "must return numbers"),
])
async def test_reward_bugs_raise_env_error(pool: CountingPool, mode: str, message: str) -> None:
    env = BuggyEnv(sandbox_pool=pool)
    env.mode = mode
    await env.areset({"id": "t", "word": "w"})
    with pytest.raises(EnvError, match=message):
        await env.astep(call("submit"))
    await env.aclose()
    assert pool.out == 0


async def test_prompt_bug_raises_env_error(pool: CountingPool) -> None:
    class BadPrompt(NoteEnv):
        def user_prompt(self, task: dict[str, Any]) -> str:
            return task["nope"]

    with pytest.raises(EnvError, match=r"BadPrompt.user_prompt raised KeyError"):
        await BadPrompt(sandbox_pool=pool).areset({"id": "t"})


def test_bad_env_definitions_are_refused() -> None:
    class Empty(ToolEnv):
        pass

    with pytest.raises(ValueError, match=r"tools is empty"):
        Empty()
    with pytest.raises(ValueError, match=r"max_turns must be an int >= 1"):
        NoteEnv(max_turns=0)
    with pytest.raises(ValueError, match=r"step_reward_alpha must be >= 0"):
        NoteEnv(step_reward_alpha=-1)
    with pytest.raises(ValueError, match=r"parser 'fenced' cannot call tool"):
        NoteEnv(parser="fenced")
    with pytest.raises(ValueError, match=r"unknown tool-call parser"):
        NoteEnv(parser="yaml")

    class Dup(ToolEnv):
        tools = (shout, shout)

    with pytest.raises(ValueError, match=r"duplicate names"):
        Dup()


async def test_injection_wiring_is_checked_at_reset() -> None:
    class NoSandbox(ToolEnv):
        tools = (note, submit)

    with pytest.raises(ValueError, match=r"tool 'note' needs a sandbox; set needs_sandbox = True"):
        await NoSandbox().areset({"id": "t", "prompt": "p"})

    @tool(inject=("retriever",))
    def lookup(q: str, retriever: Any) -> str:
        """Look up."""
        return retriever[q]

    class NoRetriever(ToolEnv):
        tools = (lookup,)

    with pytest.raises(ValueError, match=r"needs injected 'retriever', but NoRetriever has no attribute"):
        await NoRetriever().areset({"id": "t", "prompt": "p"})

    class WithRetriever(NoRetriever):
        async def reward(self, task: Any, state: Any) -> float:
            return 0.0

    env = WithRetriever()
    env.retriever = {"q": "found it"}  # any attribute can be injected by name
    await env.areset({"id": "t", "prompt": "find q"})
    assert (await env.astep(call("lookup", q="q"))).observation[0]["content"] == "found it"


@pytest.mark.parametrize("parser", ["xml", "hermes"])
async def test_other_parsers_drive_the_same_env(pool: CountingPool, parser: str) -> None:
    env = NoteEnv(sandbox_pool=pool, parser=parser)
    messages = await env.areset({"id": "t", "word": "plum"})
    fmt = get_parser(parser)
    assert fmt.format_tools(list(NoteEnv.tools)) in messages[0]["content"]
    result = await env.astep(fmt.format_call(ToolCall("shout", {"text": "hi", "times": 2})))
    assert result.observation[0]["content"] == "HI HI "
    await env.aclose()


# ---------------------------------------------------------------------------------------------
# sandbox lifecycle
# ---------------------------------------------------------------------------------------------


async def test_sandbox_is_returned_on_reset_and_close(pool: CountingPool) -> None:
    env = NoteEnv(sandbox_pool=pool)
    await env.areset({"id": "a", "word": "x"})
    first = env.sandbox
    await env.astep(call("note", text="x"))
    await env.areset({"id": "b", "word": "y"})  # the old sandbox goes back (and is reset) first
    assert pool.out == 1 and len(pool.made) == 1 and env.sandbox is first and first.files == {}
    await env.aclose()
    await env.aclose()
    assert pool.out == 0 and env.sandbox is None


# ---------------------------------------------------------------------------------------------
# Gymnasium facade and spaces
# ---------------------------------------------------------------------------------------------


def test_text_space() -> None:
    space = TextSpace()
    assert "any text ✓" in space and [{"role": "user", "content": "hi"}] in space and [] in space
    assert 3 not in space and [{"role": "user"}] not in space and [{"role": "user", "content": 1}] not in space
    space.seed(5)
    a = [space.sample() for _ in range(3)]
    space.seed(5)
    assert a == [space.sample() for _ in range(3)] and all(isinstance(s, str) for s in a)


def test_gym_facade(pool: CountingPool) -> None:
    env = NoteEnv(sandbox_pool=pool)
    obs1, info1 = env.reset(seed=3)
    obs2, info2 = env.reset(seed=3)
    assert obs1 == obs2 and info1 == info2 and info1["task_id"].startswith("train-")
    obs, info = env.reset(options={"task": {"id": "mine", "word": "kiwi"}})
    assert "kiwi" in obs[1]["content"] and info == {"task_id": "mine"}
    obs, reward, terminated, truncated, info = env.step(call("note", text="kiwi"))
    assert reward == 0.02 and not terminated and not truncated and obs[0]["content"] == "wrote 4 chars"
    obs, reward, terminated, _, info = env.step(call("submit"))
    assert terminated and reward == 0.02 + 1.0  # step reward + outcome on the last step
    with pytest.raises(EpisodeOverError, match=r"episode is over"):
        env.step("more")
    env.close()
    env.close()
    assert pool.out == 0
    with pytest.raises(EpisodeOverError, match=r"call reset"):
        env.step("after close")


async def test_gym_facade_works_inside_a_running_loop(pool: CountingPool) -> None:
    env = NoteEnv(sandbox_pool=pool)
    obs, _ = env.reset(seed=0)  # sync API called from async code: driven on a helper thread
    assert obs[0]["role"] == "system"
    env.close()


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------


def test_builtin_envs_are_preregistered() -> None:
    assert registry()["code"] == "agentrl.envs.code:CodeEnv"
    assert {"code", "search", "swe", "summarize"} <= set(agentrl.list_envs())
    assert {"agentrl/code-v0", "agentrl/swe-v0"} <= set(gymnasium.envs.registry)


def test_register_make_and_gymnasium_make(pool: CountingPool) -> None:
    register("test-note", NoteEnv)
    assert registry()["test-note"].endswith("test_env_api:NoteEnv")
    env = agentrl.make("test-note", sandbox_pool=pool, max_turns=2)
    assert isinstance(env, NoteEnv) and env.max_turns == 2 and env.spec.id == "agentrl/test-note-v0"
    gym_env = gymnasium.make("agentrl/test-note-v0", sandbox_pool=pool)
    assert isinstance(gym_env.unwrapped, NoteEnv)
    obs, _ = gym_env.reset(seed=1)
    assert obs[1]["role"] == "user"
    gym_env.close()
    assert pool.out == 0


def test_make_by_entry_point_and_errors() -> None:
    env = make(f"{ROOT / 'examples' / 'my_env.py'}:AddEnv")
    assert type(env).__name__ == "AddEnv"
    env.close()
    with pytest.raises(ValueError, match=r"unknown env 'nope'; registered: .*code"):
        make("nope")
    with pytest.raises(ImportError, match=r"cannot import module 'no_such_pkg.mod'"):
        make("no_such_pkg.mod:Env")
    with pytest.raises(ImportError, match=r"has no attribute 'Nope'"):
        load_entry_point("agentrl.env:Nope")
    with pytest.raises(ValueError, match=r"env name must match"):
        register("bad name", NoteEnv)
    with pytest.raises(ValueError, match=r"entry point must look like"):
        register("x", "no_colon")
    with pytest.raises(TypeError, match=r"not an agentrl.Env"):
        register("not-env", dict)
        make("not-env")


# ---------------------------------------------------------------------------------------------
# the real thing: built-in tools through a ToolEnv on the bubblewrap sandbox
# ---------------------------------------------------------------------------------------------


class FileEnv(ToolEnv):
    """Create a module that prints a number; the reward runs it in the sandbox."""

    tools = (str_replace_editor, python, bash, submit)
    max_turns = 6
    needs_sandbox = True

    def tasks(self, split: str = "train") -> list[dict[str, Any]]:
        return [{"id": "n7", "n": 7}]

    def user_prompt(self, task: dict[str, Any]) -> str:
        return f"Create answer.py that prints {task['n']}."

    async def reward(self, task: dict[str, Any], state: Any) -> float:
        out = await self.sandbox.exec(["python3", "answer.py"], timeout=10)
        return float(out.stdout.strip() == str(task["n"]))


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_builtin_tools_in_a_real_bwrap_env() -> None:
    env = FileEnv(tool_timeout_s=1)  # no pool given: a private local (bubblewrap) pool is made on first reset
    await env.areset(env.tasks()[0])
    r = await env.astep(call("str_replace_editor", command="create", path="answer.py", file_text="print(6)\n"))
    assert r.observation[0]["content"] == "Created answer.py."
    r = await env.astep(call("str_replace_editor", command="str_replace", path="answer.py", old_str="6", new_str="7"))
    assert "print(7)" in r.observation[0]["content"]
    r = await env.astep(call("python", code="import runpy; runpy.run_path('answer.py')") + call("bash", command="ls"))
    assert [m["content"] for m in r.observation] == ["7", "answer.py"]
    r = await env.astep(call("bash", command="sleep 20"))
    assert r.observation[0]["content"] == "Error: sandbox fault (timeout): timed out after 1 s; the process was killed"
    r = await env.astep(call("submit"))
    assert r.terminated and r.info["outcome_reward"] == 1.0
    sandbox = env.sandbox
    await env.aclose()
    assert env.sandbox is None and env._private_pool is None
    with pytest.raises(Exception, match=r"returned|closed"):
        await sandbox.exec(["true"])


def test_importing_agentrl_stays_light() -> None:
    code = ("import sys, agentrl, gymnasium; assert 'torch' not in sys.modules, 'torch imported'; "
            "gymnasium.spec('agentrl/code-v0'); print(agentrl.tool.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "tool", out.stderr
