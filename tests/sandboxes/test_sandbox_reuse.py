"""Issue 20 on the real local (bubblewrap) and Docker backends: a reset sandbox is clean, the agent's
channel cannot be hijacked or flooded, /tmp and /work have limits, and clean-up cannot be steered."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest
from conftest import RUN_ID, config

from agentrl.sandboxes import SandboxError, make_pool, make_sandbox
from agentrl.sandboxes.agent_sandbox import AgentChannel

# What one lease leaves behind in every writable place it can reach.
PLANT = ("echo planted > /work/w; echo planted > /tmp/t; echo planted > /dev/shm/s; "
         "echo planted > /dev/d 2>/dev/null; ipcmk -M 4096 >/dev/null; "
         "python3 -c \"import os, ctypes; os.mkfifo('/dev/shm/fifo'); "
         "ctypes.CDLL('librt.so.1').mq_open(b'/planted_mq', 0o102, 0o600, None)\"")
LOOK = ("cat /work/w /tmp/t /dev/shm/s /dev/d 2>/dev/null; "
        "find /work /tmp /dev/shm /dev/mqueue /dev/d -mindepth 1 2>/dev/null; "
        "ipcs -m | grep -c '^0x' || true")

# Runs in the sandbox in the background: tries to take over the agent's channel through /proc.
HIJACK = textwrap.dedent(r'''
    import os, time
    opened = []
    for pid in os.listdir("/proc"):  # the agent: PID 1 on both backends, named in its cmdline
        try:
            is_agent = pid == "1" or b"agentrl-sandbox-agent" in open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            is_agent = False
        if is_agent:
            for fd, mode in (("0", "rb"), ("1", "wb")):
                try:
                    opened.append(open(f"/proc/{pid}/fd/{fd}", mode, 0))
                except OSError:
                    pass
    print("OPENED", len(opened), flush=True)
    for f in opened:
        try:
            f.write(b'{"id": 1, "ok": true}\n') if "w" in f.mode else f.read(1)
        except OSError:
            pass
    time.sleep(1000)
''')


async def test_reuse_after_reset_finds_nothing(backend: str) -> None:
    async with make_pool(config(backend), run_id=RUN_ID, name="pytest", size=1) as pool:
        async with pool.acquire(timeout=30) as sb:
            r = await sb.exec(PLANT)
            assert r.ok, r
            r = await sb.exec(LOOK)
            assert r.stdout.count("planted") >= 3 and "/dev/shm/fifo" in r.stdout, r
            assert "/dev/mqueue/planted_mq" in r.stdout, r
            assert r.stdout.strip().endswith("1"), r
        async with pool.acquire(timeout=30) as sb:
            r = await sb.exec(LOOK)
            assert "planted" not in r.stdout, r
            assert r.stdout.split() == ["0"], f"something survived the reset: {r.stdout!r}"


async def test_hijacker_cannot_take_the_channel_or_end_the_agent_and_dies_at_reset(sandbox) -> None:
    await sandbox.write_file("/tmp/hijack.py", HIJACK)
    r = await sandbox.exec("python3 /tmp/hijack.py > /tmp/hijack.log 2>&1 & sleep 1; cat /tmp/hijack.log")
    assert r.stdout.startswith("OPENED 0"), f"sandboxed code opened the agent's channel: {r.stdout!r}"
    ping = await sandbox._ask("ping", 10)  # type: ignore[attr-defined]
    assert ping["undumpable"] is True and ping["pid"] == 1
    # nor can it end or stop the agent (PID 1 of its namespace ignores what it does not handle)
    r = await sandbox.exec("for s in TERM INT HUP QUIT USR1 STOP KILL; do kill -$s 1; done; echo sent")
    assert r.stdout == "sent\n" and (await sandbox.exec("echo alive")).stdout == "alive\n", r
    await sandbox.reset()
    r = await sandbox.exec("ps -eo pid,args | grep -c '[O]PENED' ; echo served")
    assert r.stdout == "0\nserved\n", r  # the hijacker is gone and the real agent answers


def _channel(chunks) -> AgentChannel:
    return AgentChannel(lambda data: None, chunks, lambda: None)


async def test_channel_rejects_an_impostor_and_bounds_a_flood() -> None:
    # an answer without the boot token: the channel ends with a clear reason
    ch = _channel(iter([b'{"id": 1, "ok": true}\n']))
    fut = ch.request("ping")
    with pytest.raises(SandboxError, match="without the agent's token"):
        fut.result(timeout=5)
    # 64 MiB without a newline: the host keeps at most the line limit, then gives up cleanly
    blob = b"x" * 2**20

    def flood():
        for _ in range(64):
            yield blob

    tracemalloc.start()
    try:
        ch = _channel(flood())
        fut = ch.request("ping")
        with pytest.raises(SandboxError, match=r"line over \d+ bytes without a newline"):
            fut.result(timeout=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"host memory grew by {peak / 2**20:.0f} MiB reading a flood"
    ch = _channel(iter([b"not json at all\n"]))
    with pytest.raises(SandboxError, match="not JSON"):
        ch.request("ping").result(timeout=5)


async def test_tmp_and_work_limits_hold(backend: str) -> None:
    sb = make_sandbox(config(backend, memory_mb=128, disk_mb=64), run_id=RUN_ID, pool="pytest")
    try:
        for path in ("/tmp/big", "/work/big", "/dev/shm/big"):
            r = await sb.exec(f"head -c 300000000 /dev/zero > {path}; echo rc=$?; du -m {path} | cut -f1", timeout=20)
            size_mb = int(r.stdout.split()[-1])
            assert "rc=0" not in r.stdout and size_mb <= 128, (path, r)
            await sb.exec(f"rm -f {path}")
        mounts = (await sb.exec("cat /proc/self/mountinfo")).stdout
        assert tempfile_root() not in mounts, "mountinfo shows the host's sandbox dir"
        if backend == "docker":
            attrs = sb._container.attrs  # type: ignore[attr-defined]
            assert attrs["HostConfig"]["LogConfig"]["Type"] == "none"
    finally:
        await sb.close()


def tempfile_root() -> str:
    import tempfile

    return tempfile.gettempdir()


_UNPRIVILEGED_RMTREE = """
import logging, os, shutil, stat, sys
from pathlib import Path
log = logging.getLogger("t")
{source}
_force_rmtree(Path(sys.argv[1]))
print("CLOSED")
"""


def test_cleanup_never_follows_symlinks_or_fails_as_an_unprivileged_user() -> None:
    """The host-side clean-up, run as uid 65534 over a tree that uid owns (what the issue's non-root
    host sees): a symlink in a read-only dir pointing at a file and a dir the same user owns outside
    the sandbox, a mode-000 dir, odd names. Nothing outside may change; nothing may be left."""
    import shutil
    import tempfile

    from agentrl.sandboxes import local

    home = Path(tempfile.mkdtemp(prefix="cleanup-"))  # under the session root, reachable by uid 65534
    try:
        victim = home / "host-file"
        victim.write_text("host")
        victim_dir = home / "host-dir"
        victim_dir.mkdir()
        work = home / "sandbox"
        (work / "ro").mkdir(parents=True)
        (work / "ro" / "link").symlink_to(victim)
        (work / "ro" / "dirlink").symlink_to(victim_dir)
        (work / "locked" / "deep").mkdir(parents=True)
        (work / "locked" / "deep" / "f").write_text("x")
        (work / "odd \n name\x01").mkdir()
        subprocess.run(["chown", "-hR", "65534:65534", str(home)], check=True)
        victim.chmod(0o600)
        victim_dir.chmod(0o500)
        (work / "locked").chmod(0)
        (work / "ro").chmod(0o500)
        source = inspect.getsource(local._unlock) + "\n\n" + inspect.getsource(local._force_rmtree)
        script = _UNPRIVILEGED_RMTREE.format(source=source)
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                            "-c", script, str(work)], capture_output=True, text=True, timeout=20)
        assert r.returncode == 0 and "CLOSED" in r.stdout, r.stderr
        assert not work.exists(), f"the sandbox dir was left behind: {r.stderr}"
        assert victim.stat().st_mode & 0o777 == 0o600 and victim.read_text() == "host"
        assert victim_dir.stat().st_mode & 0o777 == 0o500
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(home)], check=False)
        shutil.rmtree(home, ignore_errors=True)


async def test_local_close_survives_odd_modes_and_names() -> None:
    sb = make_sandbox(config("process"))
    work = Path(sb.work_dir)  # type: ignore[attr-defined]
    outside = work.parent / f"{work.name}-victim"
    outside.write_text("v")
    outside.chmod(0o640)
    try:
        r = await sb.exec(f"mkdir -p a/b && chmod 000 a && mkdir ro && ln -s {outside} ro/l && chmod 500 ro "
                          "&& mkdir \"$(printf 'x\\ny')\" && echo ok")
        assert r.stdout == "ok\n", r
    finally:
        await sb.close()
    assert not work.exists()
    assert outside.stat().st_mode & 0o777 == 0o640
    outside.unlink()


def test_agent_source_is_standard_library_only() -> None:
    """The agent runs in any image with python3: no third-party import may creep in."""
    from agentrl.sandboxes.agent_sandbox import AGENT_SOURCE

    r = subprocess.run([sys.executable, "-I", "-c", "import ast, json, sys; tree = ast.parse(sys.stdin.read()); "
                        "print(json.dumps(sorted({a.name.split('.')[0] for n in ast.walk(tree) if isinstance(n, ast.Import) "
                        "for a in n.names} | {n.module.split('.')[0] for n in ast.walk(tree) "
                        "if isinstance(n, ast.ImportFrom) and n.module})))"],
                       input=AGENT_SOURCE, capture_output=True, text=True, check=True)
    assert set(json.loads(r.stdout)) <= set(sys.stdlib_module_names)


async def test_reset_takes_milliseconds(sandbox) -> None:
    loop = asyncio.get_running_loop()
    times = []
    for _ in range(5):
        await sandbox.exec("echo x > /work/f; echo y > /tmp/g")
        start = loop.time()
        await sandbox.reset()
        times.append(loop.time() - start)
    assert sorted(times)[2] < 0.5, times
