"""Issue 57 on the real backends: a full /work is ENOSPC inside and the sandbox survives its reset;
every fault kind (oom, disk_full, pids, timeout, sandbox_dead) comes back with its own name, as
the model reads it through the real `python`/`bash` tools and a real env; the pool never hands out
a dead sandbox and gives up with one line when sandboxes cannot be started."""

from __future__ import annotations

import asyncio
import itertools
import os

import pytest
from conftest import RUN_ID, config

from agentrl.parsing import ToolCall
from agentrl.sandboxes import SandboxError, SandboxPool, make_pool, make_sandbox
from agentrl.sandboxes import pool as pool_module
from agentrl.sandboxes.agent import classify
from agentrl.sandboxes.common import (
    FAULT_DEAD,
    FAULT_DISK_FULL,
    FAULT_OOM,
    FAULT_PIDS,
    FAULT_TIMEOUT,
    SandboxDead,
)
from agentrl.tools import bash, python
from envs.code import CodeEnv

DISK_MB = 48
FILL = ("import errno\n"
        "f = open({path!r}, 'wb')\n"
        "try:\n"
        "    while True: f.write(b'x' * 2**20); f.flush()\n"
        "except OSError as e:\n"
        "    print('ERRNO', errno.errorcode[e.errno])\n")
MEMORY_BOMB = "a = []\nwhile True: a.append(b'x' * 2**26)\n"
# every process forks until refused, then waits and tries again: the process limit stays full without
# starving the sandbox's agent of CPU on a loaded machine (bench/soak.py injects the harsh kind)
FORK_BOMB = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.5)\n"


def faulty_config(backend: str) -> object:
    return config(backend, memory_mb=192, disk_mb=DISK_MB, pids=32)


async def test_full_work_is_enospc_and_reset_restores_it(backend: str) -> None:
    sb = make_sandbox(faulty_config(backend), run_id=RUN_ID, pool="pytest")
    try:
        r = await sb.exec(["python3", "-c", FILL.format(path="/work/fill")], timeout=30)
        assert "ERRNO ENOSPC" in r.stdout and r.fault == FAULT_DISK_FULL, r
        size_mb = int((await sb.exec("du -m /work/fill | cut -f1")).stdout)
        assert DISK_MB - 2 <= size_mb <= DISK_MB, size_mb
        # the tool shows the program's own output and names the fault
        out = await bash.call({"command": "echo more >> /work/fill"}, sandbox=sb, timeout=10)
        assert out.fault == FAULT_DISK_FULL and "No space left on device" in out.output, out
        assert out.error.startswith("sandbox fault (disk_full): no space left on device"), out
        await sb.reset()
        r = await sb.exec("df -m /work | tail -1; echo hello > /work/f && cat /work/f")
        used_mb = int(r.stdout.split()[2])
        assert used_mb <= 1 and r.stdout.endswith("hello\n") and r.fault is None, r
        # /tmp has its own cap within the memory limit
        r = await sb.exec(["python3", "-c", FILL.format(path="/tmp/fill")], timeout=30)
        assert "ERRNO ENOSPC" in r.stdout and r.fault == FAULT_DISK_FULL, r
        await sb.reset()
        assert (await sb.exec("ls -A /tmp /work; echo alive")).stdout.endswith("alive\n")
    finally:
        await sb.close()


async def test_each_fault_kind_has_its_own_name(backend: str) -> None:
    sb = make_sandbox(faulty_config(backend), run_id=RUN_ID, pool="pytest")
    try:
        # docker's commands run below the agent within the container's own CPU cgroup; bubblewrap's at
        # the host's niceness (there it would reach beyond the sandbox)
        nice = (await sb.exec("python3 -c 'import os; print(os.nice(0))'")).stdout.strip()
        assert nice == ("10" if backend == "docker" else str(os.nice(0))), nice
        oom = await python.call({"code": MEMORY_BOMB}, sandbox=sb, timeout=30)
        assert oom.fault == FAULT_OOM and oom.error.startswith("sandbox fault (oom): out of memory"), oom
        await sb.reset()
        pids = await python.call({"code": FORK_BOMB}, sandbox=sb, timeout=3)
        assert pids.fault == FAULT_PIDS and "process limit reached" in pids.error, pids
        await sb.reset()
        slow = await bash.call({"command": "sleep 30"}, sandbox=sb, timeout=1)
        assert slow.fault == FAULT_TIMEOUT and slow.error == "sandbox fault (timeout): timed out after 1 s; the process was killed", slow
        # a failing program, and one that merely prints the words, are not faults
        for code in ("raise SystemExit(3)", "import sys; print('MemoryError No space left on device', file=sys.stderr)"):
            plain = await python.call({"code": code}, sandbox=sb, timeout=10)
            assert plain.fault is None, plain
        await sb.kill()  # from the host, as an OOM killer or an operator
        assert not sb.alive
        with pytest.raises(SandboxDead):
            await sb.exec("true")
        dead = await bash.call({"command": "true"}, sandbox=sb, timeout=5)
        assert dead.fault == FAULT_DEAD and "SandboxDead" in dead.error, dead
    finally:
        await sb.close()


async def test_env_observation_names_the_fault_and_a_dead_sandbox_ends_the_episode(backend: str) -> None:
    pool = make_pool(faulty_config(backend), run_id=RUN_ID, name="pytest", size=1, health_interval_s=None)
    env = CodeEnv(num_tasks=1, sandbox_pool=pool, tool_timeout_s=30)  # room for the bomb on a loaded machine
    try:
        await env.areset(env.tasks()[0])
        action = env.tool_parser.format_call(ToolCall("python", {"code": MEMORY_BOMB}))
        step = await env.astep(action)
        assert step.info["sandbox_faults"] == [FAULT_OOM], step.info
        assert "Error: sandbox fault (oom): out of memory" in step.observation[0]["content"], step.observation
        assert pool.metrics()["faults"][FAULT_OOM] == 1
        await env.sandbox.sandbox.kill()
        with pytest.raises(SandboxDead, match=r"^sandbox_dead: "):
            await env.astep(env.tool_parser.format_call(ToolCall("python", {"code": "print(1)"})))
        await env.aclose()  # gives the dead sandbox back: the pool replaces it
        async with pool.acquire(timeout=60) as lease:
            assert (await lease.exec("echo ok")).stdout == "ok\n"
        m = pool.metrics()
        assert m["replacements"] == 1 and m["faults"][FAULT_DEAD] == 1, m
    finally:
        await env.aclose()
        await pool.close()


async def test_a_sandbox_that_died_idle_is_never_handed_out() -> None:
    async with make_pool(config("local"), name="pytest", size=2, health_interval_s=None) as pool:
        victim = pool._idle[0]
        await victim.kill()
        await asyncio.sleep(0.2)  # the channel notices the agent is gone
        seen = set()
        for _ in range(3):
            async with pool.acquire(timeout=30) as lease:
                seen.add(id(lease.sandbox))
                assert lease.sandbox is not victim
                assert (await lease.exec("echo ok")).stdout == "ok\n"
        m = pool.metrics()
        assert m["dead_skipped"] == 1 and m["replacements"] == 1, m


class _Flaky:
    """A sandbox stand-in whose reset fails (it died), for the pool's replacement logic."""

    def __init__(self, dead: bool = False) -> None:
        self.alive = not dead

    async def reset(self) -> None:
        if not self.alive:
            raise SandboxDead("gone")

    async def close(self) -> None:
        self.alive = False


async def test_failing_replacements_back_off_then_the_pool_gives_up_with_one_line() -> None:
    starts: list[float] = []
    loop = asyncio.get_running_loop()

    def factory() -> _Flaky:
        starts.append(loop.time())
        if len(starts) > 1:
            raise RuntimeError("engine not answering")
        return _Flaky()

    pool = SandboxPool(factory, size=1, name="flaky", health_interval_s=None, backoff_s=(0.05, 0.2))
    await pool.start()
    lease = await pool.get()
    lease.sandbox.alive = False  # type: ignore[attr-defined]  # it died while on loan
    waiter = asyncio.ensure_future(pool.get(timeout=30))
    await pool.put(lease)
    with pytest.raises(SandboxError, match=r"pool 'flaky': 6 sandbox starts in a row failed, the last with "
                                           r"RuntimeError\('engine not answering'\); is the sandbox backend"):
        await waiter
    gaps = [b - a for a, b in itertools.pairwise(starts[1:])]
    assert len(starts) == 7, starts
    # waits of 0.05, 0.1, then capped at 0.2 s (a loaded machine only adds to them)
    assert all(gap >= want for gap, want in zip(gaps, (0.05, 0.1, 0.2, 0.2, 0.2), strict=True)), gaps
    with pytest.raises(SandboxError, match="starts in a row failed"):
        await pool.get(timeout=1)
    m = pool.metrics()
    assert m["replace_failures"] == 6 and m["broken"], m
    await pool.close()


async def test_a_backend_that_stops_answering_breaks_the_pool_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "LIVENESS_S", 0.05)
    answers = iter([True, True])  # two pings answered, then the engine is wedged

    def ping() -> None:
        if not next(answers, False):
            raise ConnectionError("no answer")

    pool = SandboxPool(_Flaky, size=1, name="wedged", health_interval_s=None, liveness=ping)
    await pool.start()
    lease = await pool.get()
    waiter = asyncio.ensure_future(pool.get(timeout=30))  # waits on the one sandbox, on loan
    why = await asyncio.wait_for(pool.until_broken(), 10)
    assert why == ("pool 'wedged': the sandbox backend stopped answering (3 checks in a row failed, the last: "
                   "ConnectionError('no answer'))"), why
    with pytest.raises(SandboxError, match="stopped answering"):
        await waiter
    with pytest.raises(SandboxError, match="stopped answering"):
        await pool.get(timeout=1)
    await pool.put(lease)
    await pool.close()


@pytest.mark.parametrize(("evidence", "kind"), [
    ({}, None),  # a clean run
    ({"exit_code": 1, "stderr": b"Traceback ...\nValueError: bad\n"}, None),  # a failing program
    ({"stderr": b"MemoryError No space left on device\n"}, None),  # words printed by a program that succeeded
    ({"timed_out": True, "exit_code": 137}, "timeout"),
    ({"exit_code": 137, "oom_kills": 1}, "oom"),  # the cgroup's OOM killer
    ({"timed_out": True, "exit_code": 137, "mem_max_hits": 3}, "oom"),  # thrashing at the limit until the timeout
    ({"exit_code": 1, "stderr": b"MemoryError\n"}, "oom"),  # RLIMIT_AS refused it
    ({"timed_out": True, "exit_code": 137, "pids_peaked": True}, "pids"),  # a fork bomb times out too
    ({"exit_code": 1, "stderr": b"bash: fork: retry: Resource temporarily unavailable\n"}, "pids"),
    ({"filled": True, "full_now": True}, "disk_full"),  # it caught ENOSPC and exited 0
    ({"full_now": True, "stderr": b"head: error writing: No space left on device\n"}, "disk_full"),
    ({"full_now": True}, None),  # /work was full before and the command wrote nothing
])
def test_classify_names_the_cause(evidence: dict, kind: str | None) -> None:
    args = {"stderr": b"", "exit_code": 0, "timed_out": False, "oom_kills": 0, "mem_max_hits": 0, "pids_refused": 0,
            "pids_peaked": False, "filled": False, "full_now": False, **evidence}
    assert classify(**args) == kind
