"""SWE task runtimes (envs/swe/runtime.py): the package's tests run with a per-package venv built
from the sandbox's own python3, never with agentrl's interpreter (issue 14 item 1). Real
bubblewrap; the runtimes are real venvs built with pip (cached across runs)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from agentrl.config import SandboxConfig
from agentrl.envs.swe import runtime as rt
from agentrl.envs.swe.env import SWEEnv, gold_actions
from agentrl.envs.swe.schema import builtin_tasks
from agentrl.sandboxes import make_pool

CFG = SandboxConfig(backend="local", timeout_s=60.0, pids=256, max_output_bytes=8_000_000)
PROBE = "python3 -c 'import sys, pytest; print(sys.prefix); print(pytest.__file__)'"


def task_of(package: str) -> dict:
    tasks = [t for t in builtin_tasks() if t["environment_setup"]["package"].startswith(package)]
    return min(tasks, key=lambda t: (len(t["PASS_TO_PASS"]), t["instance_id"]))


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_runtime_is_built_once_atomically_and_reused(tmp_path: Path) -> None:
    spec = rt.RuntimeSpec("")  # pytest only: the smallest runtime
    (tmp_path / f"{rt.runtime_key(spec, rt.sandbox_python()[1])}").mkdir()  # a crashed build's leftover
    first = rt.ensure_runtime(spec, tmp_path)
    assert (first.path / rt.MARKER).exists() and first.info()["requirements"] == ["pytest"]
    assert Path(first.info()["python"]) == rt.sandbox_python()[0]  # the sandbox's python3, not agentrl's
    assert not list(tmp_path.glob(".build-*"))  # the temp build dir was renamed into place
    start = time.perf_counter()
    again = rt.ensure_runtime(spec, tmp_path)
    assert again == first and time.perf_counter() - start < 1.0
    out = subprocess.run([str(first.python), "-c", "import pytest, sys; print(pytest.__file__)"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith(str(first.path))


def test_agent_and_grader_use_the_mounted_runtime() -> None:
    """The env's own sandboxes: python3 is the runtime's venv, mounted read-only."""
    task = task_of("semver")

    async def run() -> None:
        env = SWEEnv(validate=False, sandbox_config=CFG, max_turns=4)
        try:
            await env.areset(task)
            probe = (await env.astep(call("bash", command=PROBE)))
            text = probe.observation[0]["content"]
            assert f"{rt.RUNTIME_MOUNT}\n{rt.RUNTIME_MOUNT}/lib/python" in text, text
            ro = await env.astep(call("bash", command=f"touch {rt.RUNTIME_MOUNT}/x"))
            assert "Read-only file system" in ro.observation[0]["content"]
            grader = await env._new_sandbox(task)
            try:
                r = await grader.exec(PROBE, timeout=30)
                assert r.stdout.startswith(rt.RUNTIME_MOUNT), r.stdout + r.stderr
            finally:
                await grader.close()
        finally:
            await env.aclose()

    asyncio.run(run())


def test_a_shared_pool_gets_the_runtime_uploaded() -> None:
    """run.py hands the env a plain pool: the runtime's site-packages are uploaded, the gold patch
    still earns 1, and grading runs in a fresh sandbox with the runtime mounted."""
    task = task_of("inflection")

    async def run() -> None:
        pool = make_pool(CFG, size=1)
        env = SWEEnv(validate=False, sandbox_pool=pool, max_turns=len(gold_actions(task)) + 1)
        try:
            await env.areset(task)
            probe = await env.astep(call("bash", command=PROBE))
            assert "/work/.agentrl/site/pytest/__init__.py" in probe.observation[0]["content"]
            for action in gold_actions(task):
                result = await env.astep(action)
            assert result.terminated and result.info["outcome_reward"] == 1.0
        finally:
            await env.aclose()
            await pool.close()

    asyncio.run(run())


def test_validation_never_imports_from_agentrls_venv(tmp_path: Path) -> None:
    """Validate a task in a fresh interpreter where pytest cannot be imported at all: what a venv
    made by `make train` (no test extras) looks like to the SWE code."""
    task = task_of("inflection")
    script = textwrap.dedent(f"""
        import asyncio, sys
        sys.modules["pytest"] = sys.modules["_pytest"] = None  # `import pytest` raises ImportError
        from agentrl.config import SandboxConfig
        from agentrl.envs.swe.env import SWEEnv
        from agentrl.envs.swe.schema import builtin_tasks, save_tasks
        task = [t for t in builtin_tasks() if t["instance_id"] == {task["instance_id"]!r}]
        save_tasks(task, {str(tmp_path / "t.jsonl")!r})
        env = SWEEnv(task_file={str(tmp_path / "t.jsonl")!r}, validation_cache={str(tmp_path / "v.json")!r},
                     sandbox_config=SandboxConfig(backend="local", timeout_s=60.0, pids=256))
        print("VALID", len(env.tasks("all")), env.rejected)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "VALID 1 []" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
