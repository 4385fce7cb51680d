"""Start a long-lived process inside a running bubblewrap sandbox (`LocalSandbox.spawn_argv`).

    python enter.py --pid PID [--uid UID] [--ro-bind HOST_PATH ...] -- ARGV...

PID is the sandbox's pid 1 as the host sees it. The process joins the sandbox's namespaces (user,
mount, pid, network, IPC, UTS), so it sees the sandbox's own /work and /tmp, has no network, and
dies with the sandbox (its pid namespace). Each `--ro-bind` shows a host path read-only at the same
path, in a mount namespace of the process's own (a copy of the sandbox's: the same /work), so that
a server's interpreter and code are there without the sandbox's other commands seeing them. The
caller must be the host uid the sandbox runs as, or root (which drops to `--uid` first: mounting a
host path into the sandbox needs root's CAP_SYS_ADMIN before the drop).

Stdlib only: it runs with the host's interpreter before it replaces itself with ARGV.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import signal
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# <linux/sched.h>, <linux/nsfs.h>, <linux/mount.h>, <sys/prctl.h>; x86_64 and aarch64 share these
# syscall numbers (the "new mount API" block is numbered alike on every architecture).
CLONE_NEWNS = 0x00020000
NS_GET_PARENT = 0xB702
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_RECURSIVE, AT_EMPTY_PATH = 1, 0o2000000, 0x8000, 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
AT_FDCWD = -100
NAMESPACES = ("mnt", "pid", "net", "ipc", "uts")  # joined after the owning user namespace


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def read_only_clone(path: str) -> int:
    """A detached read-only copy of the mount tree at host `path` (an fd, attached later)."""
    fd = check(libc.syscall(SYS_OPEN_TREE, AT_FDCWD, path.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE),
               f"open_tree {path}")
    attr = MountAttr(attr_set=MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
    check(libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(attr),
                       ctypes.sizeof(attr)), f"read-only {path}")
    return fd


def mount(source: bytes | None, target: bytes, flags: int) -> None:
    check(libc.mount(source, target, None, ctypes.c_ulong(flags), None), f"mount {target.decode()}")


def attach(clones: dict[str, int]) -> None:
    """Attach each clone at its host path, in a private copy of the sandbox's mount namespace (its
    root is read-only: opened for the mount points, then closed again)."""
    check(libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    mount(None, b"/", MS_REC | MS_PRIVATE)  # nothing done here reaches the sandbox's own namespace
    mount(None, b"/", MS_REMOUNT | MS_BIND)
    for path, fd in clones.items():
        os.makedirs(path, exist_ok=True)
        check(libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, path.encode(), MOVE_MOUNT_F_EMPTY_PATH),
              f"attach {path}")
    mount(None, b"/", MS_REMOUNT | MS_BIND | MS_RDONLY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--uid", type=int, default=None, help="host uid to run as (the sandbox's)")
    parser.add_argument("--ro-bind", action="append", default=[], dest="ro_binds")
    parser.add_argument("--cwd", default="/work")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        parser.error("no command given after --")
    ns = f"/proc/{args.pid}/ns"
    user = os.open(f"{ns}/user", os.O_RDONLY | os.O_CLOEXEC)
    owner = fcntl.ioctl(user, NS_GET_PARENT)  # bwrap nests a user namespace: the outer one owns the rest
    others = [os.open(f"{ns}/{name}", os.O_RDONLY | os.O_CLOEXEC) for name in NAMESPACES]
    clones = {os.path.realpath(p): read_only_clone(os.path.realpath(p)) for p in args.ro_binds}
    if args.uid is not None and os.geteuid() != args.uid:
        os.setgroups([])
        os.setresgid(args.uid, args.uid, args.uid)
        os.setresuid(args.uid, args.uid, args.uid)
    check(libc.setns(owner, 0), "join the sandbox's user namespace")
    for fd, name in zip(others, NAMESPACES):
        check(libc.setns(fd, 0), f"join the sandbox's {name} namespace")
    if clones:
        attach(clones)
    check(libc.setns(user, 0), "join the sandbox's inner user namespace")
    os.chdir(args.cwd)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    child = os.fork()  # only a child is in the joined pid namespace
    if child == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # stopping this launcher stops the process
        os.execvp(argv[0], argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status) % 256)


if __name__ == "__main__":
    try:
        main()
    except OSError as e:
        print(f"agentrl: could not enter the sandbox: {e}", file=sys.stderr)
        sys.exit(125)
