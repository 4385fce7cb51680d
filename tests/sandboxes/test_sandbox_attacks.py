"""The attacks of issue 4, run against the real local (bubblewrap) and Docker backends. Each must be
contained, come back as a normal ExecResult, and leave no trace."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from conftest import MARK, TEST_LIMITS, host_processes

from agentrl.sandboxes import Sandbox


async def _eventually(holds: Callable[[], bool], within_s: float = 3.0) -> bool:
    """Whether `holds()` becomes true within `within_s` (processes start and die asynchronously)."""
    deadline = time.monotonic() + within_s
    while not holds():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def _gone(needle: str, within_s: float = 3.0) -> bool:
    """Whether no host process matches `needle` within `within_s` (kills are asynchronous)."""
    return await _eventually(lambda: not host_processes(needle), within_s)


async def _running(needle: str, within_s: float = 3.0) -> bool:
    """Whether a host process matches `needle` within `within_s`: a backgrounded command may not
    have exec'd yet when the shell that started it returns (setsid forks first)."""
    return await _eventually(lambda: bool(host_processes(needle)), within_s)


async def test_basic_exec_and_files(sandbox: Sandbox) -> None:
    r = await sandbox.exec("echo hello; echo oops >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("hello\n", "oops\n", 3, False)
    await sandbox.write_file("sub/dir/data.bin", b"\x00\x01binary\xff")
    assert await sandbox.read_file("/work/sub/dir/data.bin") == b"\x00\x01binary\xff"
    r = await sandbox.exec(["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], stdin="abc")
    assert r.stdout == "cba\n"
    r = await sandbox.exec("pwd; echo $FOO", cwd="sub", env={"FOO": "bar"})
    assert r.stdout == "/work/sub\nbar\n"


async def test_tcp_connect_to_host_server_fails(sandbox: Sandbox) -> None:
    accepted = []
    server = await asyncio.start_server(lambda r, w: (accepted.append(1), w.close()), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        code = ("import socket\n"
                "try:\n"
                f"    socket.create_connection(('127.0.0.1', {port}), timeout=3); print('CONNECTED')\n"
                "except OSError as e:\n"
                "    print('BLOCKED', e)\n")
        r = await sandbox.exec(["python3", "-c", code], timeout=10)
    finally:
        server.close()
        await server.wait_closed()
    assert "BLOCKED" in r.stdout and "CONNECTED" not in r.stdout, r
    assert accepted == []


async def test_cannot_write_outside_workdir_or_read_host_files(sandbox: Sandbox, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("TOP-SECRET-42")
    r = await sandbox.exec(f"cat {secret}; cat /work/../{secret}; grep -r TOP-SECRET-42 /tmp /work 2>/dev/null; "
                           "echo pwned > /etc/agentrl-pwned; echo pwned > /usr/agentrl-pwned; "
                           "echo pwned > /agentrl-pwned; echo done")
    assert "TOP-SECRET-42" not in r.stdout
    assert r.stdout.strip().endswith("done")
    assert r.stderr.count("Read-only file system") + r.stderr.count("Permission denied") >= 3, r.stderr
    for path in ("/etc/agentrl-pwned", "/usr/agentrl-pwned", "/agentrl-pwned"):
        assert not Path(path).exists()


async def test_fork_bomb_is_contained(sandbox: Sandbox) -> None:
    code = ("import os, time\n"
            "n = 0\n"
            "try:\n"
            "    for _ in range(10_000):\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(2); os._exit(0)\n"
            "        n += 1\n"
            "except OSError as e:\n"
            "    print('LIMITED', n, e.errno)\n"
            "print('FORKED', n)\n")
    start = time.monotonic()
    r = await sandbox.exec(["python3", "-c", code], timeout=20)
    assert "LIMITED" in r.stdout, r
    forked = int(r.stdout.split("FORKED")[1].split()[0])
    assert forked < TEST_LIMITS["pids"], forked
    await sandbox.reset()  # its sleeping children hold the whole process budget until now
    # the classic shell bomb (POSIX spelling) ends at the timeout or on the process limit, not by
    # exhausting the host (which of the two comes first depends on how fast the budget fills)
    r = await sandbox.exec("bomb() { bomb | bomb & }; bomb; sleep 5", timeout=3)
    assert r.timed_out or "fork" in r.stderr.lower(), r
    assert time.monotonic() - start < 40
    await sandbox.reset()  # whatever survived the timeout dies here
    r = await sandbox.exec("echo alive")
    assert r.stdout == "alive\n", r


async def test_allocating_4gib_is_killed(sandbox: Sandbox) -> None:
    r = await sandbox.exec(["python3", "-c", "b = bytearray(4 * 2**30); print('ALLOCATED', len(b))"], timeout=30)
    assert r.exit_code != 0 and "ALLOCATED" not in r.stdout, r
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"


async def test_busy_loop_is_killed_at_timeout(sandbox: Sandbox) -> None:
    start = time.monotonic()
    r = await sandbox.exec(["python3", "-c", "while True: pass"], timeout=1.5)
    elapsed = time.monotonic() - start
    assert r.timed_out and r.exit_code == 137 and not r.ok
    assert 1.4 <= elapsed < 8, elapsed
    assert await _gone("while True: pass")
    # a child that outlives its parent in the same process group dies with the timeout too
    r = await sandbox.exec(f"(sleep {MARK}; echo never) & sleep {MARK}", timeout=1)
    assert r.timed_out and "never" not in r.stdout
    assert await _gone(f"sleep {MARK}")


async def test_background_sleep_leaves_no_orphan(backend: str) -> None:
    from conftest import RUN_ID, config

    from agentrl.sandboxes import make_sandbox

    needle = f"sleep {MARK}"
    sb = make_sandbox(config(backend), run_id=RUN_ID, pool="pytest")
    try:
        r = await sb.exec(f"{needle} > /dev/null 2>&1 & echo started", timeout=5)
        assert r.stdout == "started\n"
        assert await _running(needle)  # it does not hold the exec open, but lives on ...
        await sb.reset()
        assert await _gone(needle)  # ... until reset
        r = await sb.exec(f"setsid {needle} > /dev/null 2>&1 & echo again", timeout=5)
        assert r.stdout == "again\n" and await _running(needle)
    finally:
        await sb.close()
    assert await _gone(needle)  # or close, even when it escaped into its own session


async def test_100mb_stdout_is_truncated_with_bounded_memory(sandbox: Sandbox) -> None:
    tracemalloc.start()
    try:
        r = await sandbox.exec("head -c 100000000 /dev/zero | tr '\\0' x; echo tail-marker >&2", timeout=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    cap = TEST_LIMITS["max_output_bytes"]
    assert r.truncated and r.exit_code == 0
    assert r.stdout.startswith("x" * cap)
    assert "output truncated" in r.stdout and str(100_000_000 - cap) in r.stdout
    assert len(r.stdout) < cap + 200
    assert r.stderr == "tail-marker\n"
    assert peak < 20 * 2**20, f"host memory peaked at {peak / 2**20:.1f} MiB"


async def test_reset_wipes_workdir(sandbox: Sandbox) -> None:
    await sandbox.write_file("keep.txt", "x")
    await sandbox.exec("mkdir -p a/b && touch a/b/c .hidden && chmod 000 a")
    await sandbox.reset()
    r = await sandbox.exec("ls -A /work")
    assert r.stdout == "" and r.exit_code == 0


async def test_upload_download_roundtrip(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("print('hi')\n")
    (src / "top.txt").write_text("top")
    await sandbox.upload(str(src), "/work/repo")
    r = await sandbox.exec("python3 repo/pkg/mod.py && cat repo/top.txt")
    assert r.stdout == "hi\ntop"
    await sandbox.exec("echo new > repo/new.txt")
    await sandbox.download("/work/repo", str(tmp_path / "out"))
    assert (tmp_path / "out" / "new.txt").read_text() == "new\n"
    assert (tmp_path / "out" / "pkg" / "mod.py").read_text() == "print('hi')\n"
    await sandbox.download("repo/top.txt", str(tmp_path / "single.txt"))
    assert (tmp_path / "single.txt").read_text() == "top"


async def test_concurrent_execs_share_one_sandbox(sandbox: Sandbox) -> None:
    outs = await asyncio.gather(*(sandbox.exec(f"sleep 0.{i % 3}; echo {i}") for i in range(12)))
    assert [r.stdout for r in outs] == [f"{i}\n" for i in range(12)]
