"""Local sandboxes: bubblewrap isolation (`LocalSandbox`, the default) and no isolation at all
(`ProcessSandbox`, only when `backend: process` is asked for).

A `LocalSandbox` is one long-lived `bwrap` with every namespace unshared (no network), a read-only
root showing the host's /usr and a few /etc files, a private tmpfs /tmp, and one writable host
temp dir bound at /work. Inside it runs the agent (`agent.py`), so an exec is a fork, not a new
bwrap. rlimits are applied *inside* the sandbox with `prlimit`, after the user namespace exists:
the kernel counts RLIMIT_NPROC per (user namespace, uid), so each sandbox gets its own process
budget. When the host runs as root, bwrap itself is started as uid 65534, because a process whose
host uid is 0 is exempt from RLIMIT_NPROC (a fork bomb would not be contained otherwise).
Address space, CPU seconds and file size are limited per exec.

Nothing outlives the sandbox: bwrap leads its own process group and dies with this process
(`--die-with-parent`), and when it dies the kernel kills everything left in its pid namespace.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path

from .agent_sandbox import AGENT_ARGS, AgentChannel, AgentSandbox
from .common import WORKDIR, Limits, SandboxError, inside_path

log = logging.getLogger(__name__)

NOBODY = 65534
# /etc entries programs commonly need (dynamic linker, users, locale, TLS roots); the rest of /etc
# stays hidden.
ETC_ENTRIES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group",
               "nsswitch.conf", "localtime", "ssl", "ca-certificates", "mime.types", "gitconfig")
TEMP_PREFIX = "agentrl-sbx-"
START_TIMEOUT_S = 30.0
ENTER_SCRIPT = Path(__file__).with_name("enter.py")  # run by the host's interpreter (spawn_argv)
SHM_MB = 64  # /dev/shm, as Docker's default
_SETPRIV = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")


def _require(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise SandboxError(f"'{binary}' not found on PATH; install it with: apt-get install -y {package}")
    return path


@functools.cache
def _root_binds() -> tuple[str, ...]:
    """bwrap arguments that show the host's system dirs read-only, mirroring merged-/usr symlinks."""
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ETC_ENTRIES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return tuple(args)


@functools.cache
def _drop_to_nobody() -> bool:
    """Whether bwrap should run as uid 65534. Only relevant as root; checked once per process because
    some hosts forbid unprivileged user namespaces."""
    if os.geteuid() != 0:
        return False
    probe = [*_SETPRIV, _require("bwrap", "bubblewrap"), "--unshare-all", *_root_binds(), "--", "/bin/true"]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        log.warning("bwrap cannot run as uid %d here (unprivileged user namespaces disabled?); "
                    "running it as root, so the process-count limit is NOT enforced", NOBODY)
    return ok


def _unlock(path: Path) -> None:
    """Give the owner rwx on every directory under `path` (sandboxed code may have left mode 000),
    without ever following a symlink: each entry is opened O_PATH|O_NOFOLLOW and only a directory
    found that way is chmod-ed, through its own fd."""
    stack = [str(path)]
    while stack:
        current = stack.pop()
        try:
            fd = os.open(current, os.O_PATH | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                continue
            if st.st_mode & stat.S_IRWXU != stat.S_IRWXU:
                os.chmod(f"/proc/self/fd/{fd}", stat.S_IRWXU)  # the dir the fd pins, not a link
            with os.scandir(current) as it:
                stack.extend(e.path for e in it if e.is_dir(follow_symlinks=False))
        except OSError:
            continue
        finally:
            os.close(fd)


def _force_rmtree(path: Path) -> None:
    """Remove a tree sandboxed code wrote to, whatever it planted: symlinks are removed, never
    followed; modes are fixed on the tree's own directories only. Never raises."""
    try:
        if not os.path.lexists(path):
            return
        if path.is_symlink() or not path.is_dir():
            path.unlink()
            return
        _unlock(path)
        shutil.rmtree(path, ignore_errors=True)
        if os.path.lexists(path):
            log.warning("could not remove sandbox dir %s entirely", path)
    except Exception as e:  # clean-up must never fail a close()
        log.warning("removing sandbox dir %s failed: %r", path, e)


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group the sandbox leads, then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def _cleanup(host_dir: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        _kill_tree(proc)
    procs.clear()
    _force_rmtree(host_dir)


class LocalSandbox(AgentSandbox):
    """A bubblewrap sandbox on this host (starts in tens of milliseconds)."""

    def __init__(self, limits: Limits | None = None, *, tmp_root: str | None = None,
                 ro_binds: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(limits)
        self.ro_binds = tuple(ro_binds)  # (host path, sandbox path): extra read-only mounts (SWE task runtimes)
        self._check_binaries()
        # the pid in the name lets admin.prune_local_dirs() spot dirs of dead processes
        self._host_dir = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=tmp_root))
        if self._uid is not None:
            os.chown(self._host_dir, self._uid, self._uid)
        self._check_reachable()
        self._procs: list[subprocess.Popen[bytes]] = []
        # kills the sandbox and removes its dir if it is dropped without close(), or at interpreter exit
        self._finalizer = weakref.finalize(self, _cleanup, self._host_dir, self._procs)

    # -- backend specifics ------------------------------------------------------------------------

    def _check_binaries(self) -> None:
        _require("bwrap", "bubblewrap")
        _require("prlimit", "util-linux")
        if os.geteuid() == 0:
            _require("setpriv", "util-linux")

    @property
    def _uid(self) -> int | None:
        """Host uid the sandboxed processes run as (None: this process's own)."""
        return NOBODY if _drop_to_nobody() else None

    def _check_reachable(self) -> None:
        """bwrap runs as uid 65534 (when we are root) and must be able to walk to the work dir."""
        if self._uid is None:
            return
        for parent in self._host_dir.parents:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                self._host_dir.rmdir()
                raise SandboxError(f"sandbox work dirs must be reachable by uid {self._uid}, but {parent} is not "
                                   "(no o+x); use a tmp_root under /tmp or `chmod o+x` it")

    def _agent_argv(self) -> list[str]:
        uid_args = ["--uid", str(NOBODY), "--gid", str(NOBODY)] if os.geteuid() == 0 else []
        prefix = list(_SETPRIV) if self._uid is not None else []
        return [*prefix, "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox",
                *_root_binds(), "--proc", "/proc", "--dev", "/dev", *self._tmpfs_args(),
                *[a for src, dst in self.ro_binds for a in ("--ro-bind", src, dst)],
                "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR, *uid_args, "--",
                "prlimit", f"--nproc={self.limits.pids}", "--core=0", "--", "python3", *AGENT_ARGS]

    def _tmpfs_args(self) -> list[str]:
        """Size-capped tmpfs mounts for every writable path: /work (disk_mb, the work dir's quota),
        /tmp (half of memory_mb, as on docker) and /dev/shm. They live in host memory and die with
        the sandbox; /work is not a host dir, so mountinfo shows no host path for it."""
        mib = 2**20
        return ["--mqueue", "/dev/mqueue",  # POSIX message queues, visible so that reset can empty them
                "--perms", "1777", "--size", str(SHM_MB * mib), "--tmpfs", "/dev/shm",
                "--perms", "1777", "--size", str(max(self.limits.memory_mb // 2, 1) * mib), "--tmpfs", "/tmp",
                "--perms", "0755", "--size", str(self.limits.disk_mb * mib), "--tmpfs", WORKDIR]

    def _command(self, argv: list[str], timeout: float) -> list[str]:
        lim = self.limits
        return ["prlimit", f"--as={lim.memory_mb * 2**20}", f"--cpu={lim.cpu_seconds(timeout)}",
                f"--fsize={lim.file_size_mb * 2**20}", "--", *argv]

    def spawn_argv(self, argv: list[str], *, env: dict[str, str] | None = None,
                   ro_binds: tuple[str, ...] = (), cwd: str = WORKDIR) -> list[str]:
        """`enter.py` joins the running sandbox's namespaces (its /work, no network, its pid
        namespace: the process dies with the sandbox) and runs `argv` as the sandbox's uid, under
        the exec path's rlimits but the CPU-seconds one (a server lives for the whole episode; the
        caller bounds each request). A host path of `ro_binds` under /work or /tmp leaves an empty
        mount-point directory there, seen by the sandbox's commands."""
        if not argv:
            raise SandboxError("empty command")
        pid = self._pid_one()
        lim = self.limits
        env_args = [f"{k}={v}" for k, v in {**self.base_env, **(env or {})}.items()]
        uid_args = ["--uid", str(self._uid)] if self._uid is not None else []
        return [sys.executable, "-I", str(ENTER_SCRIPT), "--pid", str(pid), *uid_args, "--cwd", self._inside(cwd),
                *[a for path in ro_binds for a in ("--ro-bind", path)], "--",
                "env", "-i", *env_args, "prlimit", f"--as={lim.memory_mb * 2**20}", f"--fsize={lim.file_size_mb * 2**20}",
                f"--nproc={lim.pids}", "--core=0", "--", *argv]

    def _pid_one(self) -> int:
        """The host pid of the sandbox's pid 1 (bwrap's only child)."""
        proc = self._procs[-1] if self._procs and self._channel is not None else None
        if proc is None or proc.poll() is not None:
            raise SandboxError(f"{self!r} is not running (start it first)")
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        if not children:
            raise SandboxError(f"{self!r} has no sandboxed process yet")
        return int(children[0])

    def _launch(self) -> AgentChannel:
        proc = subprocess.Popen(self._agent_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=self.base_env, cwd=self._host_dir,
                                start_new_session=True)
        self._procs.append(proc)
        errors: collections.deque[bytes] = collections.deque(maxlen=50)  # the agent's stderr, for diagnosis
        threading.Thread(target=lambda: errors.extend(iter(proc.stderr.readline, b"")),  # type: ignore[union-attr]
                         daemon=True).start()
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout

        def send(data: bytes) -> None:
            stdin.write(data)
            stdin.flush()

        def close() -> None:
            with contextlib.suppress(OSError):
                stdin.close()
            _kill_tree(proc)

        channel = AgentChannel(send, iter(lambda: stdout.read1(65536), b""), close,
                               restore=self.kill_all_on_reset)
        try:
            channel.request("ping").result(timeout=START_TIMEOUT_S)
        except Exception as e:
            channel.close()
            tail = b"".join(errors).decode(errors="replace").strip()[-2000:]
            raise SandboxError(f"{type(self).__name__} did not start ({e}): {tail or 'no output'}") from e
        return channel

    def _teardown(self) -> None:
        self._finalizer()

    def _kill(self) -> None:
        for proc in self._procs:
            _kill_tree(proc)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._host_dir})"


class ProcessSandbox(LocalSandbox):
    """No isolation: the agent runs as a plain process in a host temp dir, with per-exec rlimits and
    process-group kills. Only for hosts without bubblewrap, and only when `backend: process` is
    asked for explicitly. Its work dir is a host path (`work_dir`); paths under /work map onto it."""

    kill_all_on_reset = False  # no pid namespace: kill only the process groups it started

    def __init__(self, limits: Limits | None = None, *, tmp_root: str | None = None) -> None:
        super().__init__(limits, tmp_root=tmp_root)
        self.wipe_on_reset = (str(self._host_dir),)
        self.base_env["HOME"] = str(self._host_dir)

    def _check_binaries(self) -> None:
        _require("prlimit", "util-linux")

    @property
    def _uid(self) -> int | None:
        return None

    @property
    def work_dir(self) -> str:
        return str(self._host_dir)

    def _inside(self, path: str) -> str:
        full = inside_path(path, str(self._host_dir))
        if full == WORKDIR or full.startswith(WORKDIR + "/"):
            full = str(self._host_dir) + full[len(WORKDIR):]
        return full

    def _agent_argv(self) -> list[str]:
        return ["prlimit", "--core=0", "--", sys.executable, *AGENT_ARGS]

    def spawn_argv(self, argv: list[str], *, env: dict[str, str] | None = None,
                   ro_binds: tuple[str, ...] = (), cwd: str = WORKDIR) -> list[str]:
        raise NotImplementedError("the process backend has no sandbox to start a long-lived process in; "
                                  "use the local (bubblewrap) backend")
