"""Local-backend specifics: isolation details, the file API's path checks, rlimits, bad input."""

from __future__ import annotations

import os

import pytest
from conftest import config

from agentrl.config import SandboxConfig
from agentrl.sandboxes import LocalSandbox, ProcessSandbox, SandboxError, make_pool, make_sandbox
from agentrl.sandboxes.common import Limits, inside_path, truncation_marker


async def test_namespaces_and_identity() -> None:
    sb = make_sandbox(config("local"))
    try:
        r = await sb.exec("id -u; hostname; ls /; cat /proc/1/cmdline | tr '\\0' ' '; ip link 2>/dev/null || "
                          "cat /proc/net/dev")
        lines = r.stdout.splitlines()
        if os.geteuid() == 0:
            assert lines[0] == "65534"  # root on the host is never root in the sandbox
        assert lines[1] == "sandbox"
        assert "eth0" not in r.stdout  # only loopback exists in a fresh network namespace
        assert "home" not in lines and "root" not in lines  # the host's tree is not visible
    finally:
        await sb.close()


async def test_file_api_sees_only_the_sandbox(tmp_path) -> None:
    """File calls run inside the sandbox as its user: symlinks planted by sandboxed code resolve in
    the sandbox's view, never the host's."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("TOP-SECRET")
    sb = LocalSandbox(Limits(timeout_s=5))
    try:
        await sb.exec(f"ln -s {secret} secret-link; ln -s /etc/shadow shadow-link")
        for bad in (str(secret), "secret-link", "shadow-link", "/etc/shadow"):
            with pytest.raises(FileNotFoundError, match="no such file in sandbox"):
                await sb.read_file(bad)
        with pytest.raises(SandboxError, match=r"write_file.*failed"):
            await sb.write_file("/etc/agentrl-pwned", "data")  # read-only root
        with pytest.raises(SandboxError, match="Directory nonexistent"):  # the host path does not exist there
            await sb.write_file("secret-link", "overwritten")
        assert secret.read_text() == "TOP-SECRET"
        with pytest.raises(SandboxError, match="is a directory"):
            await sb.read_file("/work")
    finally:
        await sb.close()


async def test_file_size_and_cpu_limits() -> None:
    sb = LocalSandbox(Limits(timeout_s=20, file_size_mb=1, cpus=1))
    try:
        r = await sb.exec("head -c 3000000 /dev/zero > big; ls -l big | awk '{print $5}'")
        assert int(r.stdout.split()[-1]) <= 2**20  # stopped at the 1 MiB file-size limit
        # CPU rlimit = ceil(timeout * cpus) + 1 s: a busy loop with a long wall budget dies by SIGXCPU/KILL
        r = await sb.exec(["python3", "-c", "while True: pass"], timeout=1.0)
        assert r.timed_out
    finally:
        await sb.close()


async def test_exec_and_close_errors() -> None:
    sb = LocalSandbox()
    with pytest.raises(SandboxError, match="timeout must be > 0"):
        await sb.exec("true", timeout=0)
    with pytest.raises(SandboxError, match="empty command"):
        await sb.exec([])
    with pytest.raises(TypeError, match="str or bytes"):
        await sb.write_file("x", 3)  # type: ignore[arg-type]
    await sb.close()
    await sb.close()  # idempotent
    with pytest.raises(SandboxError, match="closed"):
        await sb.exec("true")


def test_missing_bwrap_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    (tmp_path / "prlimit").symlink_to("/usr/bin/prlimit")
    monkeypatch.setenv("PATH", str(tmp_path))  # prlimit is there, bwrap is not
    with pytest.raises(SandboxError, match="apt-get install -y bubblewrap"):
        make_sandbox(SandboxConfig(backend="local"))


def test_backend_choice_is_explicit() -> None:
    with pytest.raises(ValueError, match="unknown sandbox backend 'chroot'"):
        make_sandbox(SandboxConfig(backend="chroot"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        make_pool(SandboxConfig(backend="nope"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sandbox limit 'pids' must be > 0"):
        Limits(pids=0)


async def test_process_backend_runs_unisolated_in_its_dir() -> None:
    sb = make_sandbox(config("process"))
    assert isinstance(sb, ProcessSandbox)
    try:
        r = await sb.exec("pwd")
        assert r.stdout.strip() == sb.work_dir
        await sb.write_file("/work/a.txt", "A")  # /work paths map onto its dir
        assert (await sb.exec("cat a.txt")).stdout == "A"
        r = await sb.exec(["python3", "-c", "while True: pass"], timeout=0.5)
        assert r.timed_out and r.exit_code == 137
    finally:
        await sb.close()
    assert not os.path.exists(sb.work_dir)


def test_paths_and_marker() -> None:
    assert inside_path("a/../b") == "/work/b" and inside_path("/x", "/work") == "/x"
    assert inside_path("/work/../etc") == "/etc"
    with pytest.raises(SandboxError, match="non-empty string"):
        inside_path("")
    assert truncation_marker(5) == "\n[... output truncated: 5 more bytes omitted ...]\n"


async def test_dropped_sandbox_dir_is_removed_and_dead_dirs_pruned(tmp_path) -> None:
    import gc
    import subprocess

    from agentrl.sandboxes.admin import prune_local_dirs
    from agentrl.sandboxes.local import TEMP_PREFIX

    if os.geteuid() == 0:
        with pytest.raises(SandboxError, match="must be reachable by uid 65534"):
            LocalSandbox(tmp_root=str(tmp_path))  # pytest's tmp dirs are 0700
    tmp_path.chmod(0o711)
    for parent in tmp_path.parents:
        if parent.name.startswith("pytest-"):
            parent.chmod(0o711)
    sb = LocalSandbox(tmp_root=str(tmp_path))
    assert (await sb.exec("echo x > f")).ok
    work = sb._host_dir
    del sb
    gc.collect()
    assert not work.exists(), "a sandbox dropped without close() must not leave its dir"
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"{TEMP_PREFIX}{dead.pid}-abc" / "sub").mkdir(parents=True)
    (tmp_path / f"{TEMP_PREFIX}{os.getpid()}-live").mkdir()
    assert prune_local_dirs(str(tmp_path)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{TEMP_PREFIX}{os.getpid()}-live"]
    (tmp_path / f"{TEMP_PREFIX}{os.getpid()}-live").rmdir()


async def test_process_backend_reset_kills_only_its_own() -> None:
    import asyncio
    import subprocess

    from conftest import MARK, host_processes

    bystander = subprocess.Popen(["sleep", f"{MARK}1"])  # a host process the sandbox must not touch
    sb = make_sandbox(config("process"))
    try:
        await sb.exec(f"sleep {MARK}2 > /dev/null 2>&1 &")
        assert host_processes(f"sleep {MARK}2")
        await sb.reset()
        for _ in range(50):
            if not host_processes(f"sleep {MARK}2"):
                break
            await asyncio.sleep(0.05)
        assert not host_processes(f"sleep {MARK}2")
        assert bystander.poll() is None, "reset of a process sandbox killed a host process"
    finally:
        await sb.close()
        bystander.kill()
        bystander.wait()
