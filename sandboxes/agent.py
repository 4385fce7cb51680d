"""The in-sandbox agent: runs commands on request, so an exec costs a fork, not a new sandbox.

Every backend starts one per sandbox (its source is the first line on stdin, see
agent_sandbox.AGENT_ARGS): inside bubblewrap, as a container's PID 1, or as a plain process.
Requests arrive as JSON lines on stdin, answers leave as JSON lines on stdout (both carry an
`id`; requests are served concurrently, one thread each):

    {"id": 1, "op": "exec", "argv": [...], "cwd": "/work", "env": {...}, "stdin": b64|null,
     "timeout": 10.0, "cap": 1000000, "pids": 64|null, "watch": ["/work", "/tmp"], "nice": 0}
      -> {"id": 1, "stdout": b64, "stderr": b64, "out_omitted": n, "err_omitted": n,
          "exit_code": 0, "timed_out": false, "fault": null|"oom"|"disk_full"|"pids"|"timeout"}
    {"id": 2, "op": "reset", "wipe": ["/work", "/tmp"], "kill_all": true}  -> {"id": 2, "ok": true}
    {"id": 3, "op": "ping"}  -> {"id": 3, "ok": true, "pid": 1}

The line after the source is {"token": ..., "restore": bool}: a token only the host and this
agent know (every answer carries it as "t", so the host can tell its own agent from an impostor),
and whether to restore the writable tmpfs mounts on reset (never without a mount namespace of its
own). The agent makes itself non-dumpable (prctl PR_SET_DUMPABLE 0): sandboxed code under the
same uid then cannot open /proc/<agent>/fd, read its memory or ptrace it, so it can neither read
nor write the channel.

`fault` names a sandbox limit the command ran into (`classify`): the memory cgroup's OOM kills,
hits of its limit and use at its limit when the command timed out, and the pids cgroup's refused
forks where the sandbox has cgroup files of its own (Docker); the process count against `pids`
(sampled while it runs, in a pid namespace of its own); a `watch` dir left with no free block;
and the errors programs print when the kernel refuses memory, a fork or a write (bubblewrap has
no cgroup of its own, so these are what it has).

An exec ends when its command exits, or at its timeout, when its process group is killed; what it
left in the background keeps running until `reset` but does not hold the exec open (unless it hit
the process limit: then its process group is killed as the exec ends). Output past
`cap` bytes per stream is counted, not kept. `reset` kills every other process in the sandbox's
pid namespace (`kill_all`; only the process groups it started when there is no namespace) and
empties the `wipe` dirs, removes SysV IPC objects, and puts every other writable tmpfs it saw at
start-up (/dev, /dev/shm, /dev/mqueue, ...) back to the entries it had then. When it is PID 1 it
also reaps orphans. Standard library only.
"""

import base64
import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time

CHUNK = 65536
DRAIN_S = 0.05  # after the command exits, how long to keep reading output its children still write
_write_lock = threading.Lock()
_ours: set = set()  # pids of the commands we started (their threads reap them)
_groups: set = set()  # process groups we started, for reset without a pid namespace
_ours_lock = threading.Lock()
_token = ""  # set from the host's second line
_baseline: dict = {}  # writable tmpfs mount point -> the paths it held at start-up
VOLATILE_FS = ("tmpfs", "shm", "mqueue")
PIDS_SAMPLE_S = 0.05  # how often a running exec counts the sandbox's processes
# cgroup counters ((v2 file, field), (v1 file, field); field None: the file is the number): OOM
# kills, times memory use hit the limit, forks refused at pids.max
OOM_COUNTER = (("/sys/fs/cgroup/memory.events", "oom_kill"),
               ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"))
MEM_MAX_COUNTER = (("/sys/fs/cgroup/memory.events", "max"), ("/sys/fs/cgroup/memory/memory.failcnt", None))
PIDS_COUNTER = (("/sys/fs/cgroup/pids.events", "max"), ("/sys/fs/cgroup/pids/pids.events", "max"))
MEM_USAGE = (("/sys/fs/cgroup/memory.current", None), ("/sys/fs/cgroup/memory/memory.usage_in_bytes", None))
MEM_LIMIT = (("/sys/fs/cgroup/memory.max", None), ("/sys/fs/cgroup/memory/memory.limit_in_bytes", None))
AT_LIMIT = 0.95  # memory use at this share of the cgroup's limit when a command times out: it was thrashing
# what programs print when the kernel refuses them (lower case; matched against stderr)
OOM_TEXT = (b"memoryerror", b"cannot allocate memory", b"std::bad_alloc", b"out of memory")
PIDS_TEXT = (b"fork: retry", b"fork: resource temporarily unavailable", b"cannot fork",
             b"can't start new thread", b"blockingioerror: [errno 11]")
DISK_TEXT = (b"no space left on device", b"[errno 28]")


def reply(message: dict) -> None:
    data = (json.dumps({**message, "t": _token}) + "\n").encode()
    with _write_lock:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def reap_orphans(*_: object) -> None:
    """Reap zombies that are not our own commands (orphans re-parented to PID 1)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        with _ours_lock:
            if pid in _ours:
                continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and fields[1] == "1":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def counter(spec: tuple) -> int:
    """A cgroup event counter (0 where the sandbox has no such file: bubblewrap, cgroup-less hosts)."""
    for path, field in spec:
        with contextlib.suppress(OSError, ValueError), open(path) as f:
            if field is None:
                return int(f.read())
            for line in f:
                name, _, value = line.partition(" ")
                if name == field:
                    return int(value)
    return 0


def memory_at_limit() -> bool:
    """Whether the memory cgroup (docker) is at its limit now: a program there may thrash (the
    kernel evicting its code pages) instead of being OOM-killed, until its timeout."""
    limit = counter(MEM_LIMIT)
    return limit > 0 and counter(MEM_USAGE) >= AT_LIMIT * limit


def tasks_in_use() -> int:
    """Processes in this pid namespace plus the agent's own extra threads: what the process limit
    (RLIMIT_NPROC / pids.max, both counting threads) is charged with, near enough."""
    with contextlib.suppress(OSError):
        return sum(e.isdigit() for e in os.listdir("/proc")) + threading.active_count() - 1
    return 0


def full(dirs: list) -> bool:
    """Whether any of `dirs` has no free block left."""
    for path in dirs:
        with contextlib.suppress(OSError):
            if os.statvfs(path).f_bavail == 0:
                return True
    return False


def classify(stderr: bytes, exit_code: int, timed_out: bool, oom_kills: int, mem_max_hits: int,
             pids_refused: int, pids_peaked: bool, filled: bool, full_now: bool) -> "str | None":
    """The sandbox limit a command ran into, if any; the cause first (a fork bomb also times out,
    and so does a program thrashing at the memory limit). `filled`: a watched dir had free space
    before the command and none after; `full_now`: one has none now. An error text, or memory use
    at the limit, counts only with a sign that the command failed (or the disk is full), so a
    program that merely prints the words is no fault."""
    text = stderr.lower()
    failed = exit_code != 0 or timed_out
    if oom_kills or (failed and (mem_max_hits or any(t in text for t in OOM_TEXT))):
        return "oom"
    if pids_refused or pids_peaked or (failed and any(t in text for t in PIDS_TEXT)):
        return "pids"
    if filled or (full_now and any(t in text for t in DISK_TEXT)):
        return "disk_full"
    return "timeout" if timed_out else None


def run(req: dict) -> dict:
    stdin = base64.b64decode(req["stdin"]) if req.get("stdin") is not None else None
    cap = int(req.get("cap", 1_000_000))
    pids = req.get("pids")  # set only in a pid namespace of the sandbox's own
    oom_before, mem_max_before = counter(OOM_COUNTER), counter(MEM_MAX_COUNTER)
    pids_before = counter(PIDS_COUNTER)
    watch = req.get("watch") or []
    full_before = full(watch)
    try:
        with _ours_lock:  # hold the lock so the reaper never sees our child before we record it
            proc = subprocess.Popen(req["argv"], cwd=req.get("cwd") or "/work", env=req.get("env"),
                                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            _ours.add(proc.pid)
            _groups.add(proc.pid)  # start_new_session: its pid is its process group
        if req.get("nice"):  # below the agent, so that CPU-hungry code cannot starve it (see AgentSandbox)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PGRP, proc.pid, int(req["nice"]))
    except OSError as e:  # no such program, bad cwd, fork refused (pids limit)
        refused = isinstance(e, BlockingIOError)  # EAGAIN: the process limit is full
        return {"stdout": "", "stderr": base64.b64encode(f"{e}\n".encode()).decode(), "out_omitted": 0,
                "err_omitted": 0, "exit_code": 127 if isinstance(e, FileNotFoundError) else 126,
                "timed_out": False, "fault": "pids" if refused else None}
    if stdin is not None:
        try:
            threading.Thread(target=feed, args=(proc, stdin), daemon=True).start()
        except RuntimeError:  # no thread to be had: the process limit is full
            end_group(proc.pid)
            proc.wait()
            with _ours_lock:
                _ours.discard(proc.pid)
            proc.stdout.close()
            proc.stderr.close()
            why = b"cannot start the command: the sandbox's process limit is full\n"
            return {"stdout": "", "stderr": base64.b64encode(why).decode(), "out_omitted": 0, "err_omitted": 0,
                    "exit_code": 126, "timed_out": False, "fault": "pids"}
    kept = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    omitted = {proc.stdout: 0, proc.stderr: 0}
    sel = selectors.DefaultSelector()
    for stream in kept:
        sel.register(stream, selectors.EVENT_READ)
    deadline = time.monotonic() + float(req.get("timeout", 10.0))
    timed_out, exited_at = False, None
    pids_peaked, next_sample, thrashing = False, 0.0, False
    while sel.get_map():
        now = time.monotonic()
        if pids and not pids_peaked and now >= next_sample:
            pids_peaked = tasks_in_use() >= int(pids) - 1
            next_sample = now + PIDS_SAMPLE_S
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > DRAIN_S:
            break  # only background processes still hold the pipes
        if exited_at is None and now >= deadline:
            timed_out = True
            thrashing = memory_at_limit()  # before the kill frees it
            kill_group(proc.pid)
            exited_at = now
        for key, _ in sel.select(timeout=0.02):
            chunk = os.read(key.fd, CHUNK)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            buf = kept[key.fileobj]
            room = cap - len(buf)
            buf += chunk[:max(room, 0)]
            omitted[key.fileobj] += max(0, len(chunk) - max(room, 0))
    sel.close()
    if timed_out:
        kill_group(proc.pid)
    code = proc.wait()
    with _ours_lock:
        _ours.discard(proc.pid)
    proc.stdout.close()
    proc.stderr.close()
    exit_code = 128 - code if code < 0 else code
    err = bytes(kept[proc.stderr])
    full_after = full(watch)
    fault = classify(err, exit_code, timed_out, counter(OOM_COUNTER) - oom_before,
                     counter(MEM_MAX_COUNTER) - mem_max_before + thrashing, counter(PIDS_COUNTER) - pids_before,
                     pids_peaked, full_after and not full_before, full_after)
    if fault == "pids":  # what it left behind holds the whole process budget (a fork bomb): end it now
        end_group(proc.pid)
    return {"stdout": base64.b64encode(bytes(kept[proc.stdout])).decode(),
            "stderr": base64.b64encode(err).decode(),
            "out_omitted": omitted[proc.stdout], "err_omitted": omitted[proc.stderr],
            "exit_code": exit_code, "timed_out": timed_out, "fault": fault}


def group_left(pgid: int) -> bool:
    """Whether any process (zombies too) is still in process group `pgid`."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[2]) == pgid:
                    return True
    return False


def end_group(pgid: int, within_s: float = 2.0) -> None:
    """SIGKILL process group `pgid` until nothing of it is left (its members fork while they are
    killed), reaping what was re-parented to us, so that its process budget is free again."""
    deadline = time.monotonic() + within_s
    while True:
        kill_group(pgid)
        if os.getpid() == 1:
            reap_orphans()
        if not group_left(pgid) or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def feed(proc: subprocess.Popen, data: bytes) -> None:
    with contextlib.suppress(OSError):
        proc.stdin.write(data)
        proc.stdin.close()


def kill_group(pgid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def _force(func, path, _exc) -> None:
    """rmtree error hook: make what sandboxed code locked (e.g. mode 000) removable, then retry.
    Never chmods through a symlink."""
    for p in (os.path.dirname(path), path):
        if not os.path.islink(p):
            with contextlib.suppress(OSError):
                os.chmod(p, 0o700)
    with contextlib.suppress(OSError):
        func(path)


def remove(full: str) -> None:
    if os.path.isdir(full) and not os.path.islink(full):
        with contextlib.suppress(OSError):
            os.chmod(full, 0o700)
        shutil.rmtree(full, onerror=_force)
    else:
        with contextlib.suppress(OSError):
            os.unlink(full)


def wipe(path: str) -> None:
    with contextlib.suppress(OSError):
        for name in os.listdir(path):
            remove(os.path.join(path, name))


def writable_tmpfs() -> list:
    """Mount points of the writable in-memory file systems this sandbox sees."""
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields, fs = pre.split(), post.split()
            if fs and fs[0] in VOLATILE_FS and "rw" in fields[5].split(","):
                found.append(fields[4].replace("\\040", " "))
    return found


def entries(top: str) -> set:
    """Every path under `top` on the same file system, not following symlinks."""
    seen = set()
    with contextlib.suppress(OSError):
        dev = os.lstat(top).st_dev
        for root, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if os.lstat(os.path.join(root, d)).st_dev == dev]
            seen.update(os.path.join(root, n) for n in dirs + files)
    return seen


def snapshot() -> None:
    """Remember what each writable tmpfs holds at start-up."""
    for top in writable_tmpfs():
        _baseline[top] = entries(top)


def restore(wiped: list) -> None:
    """Remove whatever appeared in a snapshotted tmpfs since start-up (deepest first); the wiped
    dirs were emptied already."""
    for top, before in _baseline.items():
        if top in wiped:
            continue
        for path in sorted(entries(top) - before, key=len, reverse=True):
            if os.path.lexists(path):
                remove(path)


def drop_ipc() -> None:
    """SysV shared memory, queues and semaphores outlive their processes: remove them."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["ipcrm", "--all"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=5)


def undumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0); whether it took."""
    try:
        import ctypes  # inside the try: a minimal Python may lack it

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0 and libc.prctl(3, 0, 0, 0, 0) == 0
    except Exception:
        return False


def reset(wipe_dirs: list, kill_all: bool) -> None:
    if kill_all:  # inside a pid namespace: every process but PID 1 and this one
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
    else:  # no namespace: only what we started (and did not escape into a new session)
        with _ours_lock:
            groups = set(_groups)
        for pgid in groups:
            kill_group(pgid)
    with _ours_lock:
        _groups.clear()
    time.sleep(0.01)
    if os.getpid() == 1:
        reap_orphans()
    if kill_all:
        drop_ipc()
    for path in wipe_dirs:
        wipe(path)
    restore(wipe_dirs)


def serve(line: bytes) -> None:
    req = {}
    try:
        req = json.loads(line)
        op = req.get("op", "exec")
        if op == "exec":
            reply({"id": req["id"], **run(req)})
        elif op == "reset":
            reset(req.get("wipe", []), bool(req.get("kill_all")))
            reply({"id": req["id"], "ok": True})
        else:
            reply({"id": req["id"], "ok": True, "pid": os.getpid(), "undumpable": _undumpable})
    except Exception as e:  # answer, never die: PID 1 dying ends the container
        reply({"id": req.get("id"), "error": f"{type(e).__name__}: {e}"})


_undumpable = False


def main() -> None:
    global _token, _undumpable
    boot = json.loads(sys.stdin.buffer.readline())
    _token = boot["token"]
    _undumpable = undumpable()
    if boot.get("restore"):  # only in a sandbox of its own: the tmpfs mounts are the sandbox's
        snapshot()
    if os.getpid() == 1:  # the kernel drops signals from inside the namespace that PID 1 does not
        signal.signal(signal.SIGCHLD, reap_orphans)  # handle, so sandboxed code cannot end or stop it
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Python's own handler would let SIGINT through
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            threading.Thread(target=serve, args=(line,), daemon=True).start()
        except RuntimeError:  # no thread to be had (pids limit full, e.g. a fork bomb): serve inline
            serve(line)
    os._exit(0)  # stdin closed: the host is gone


if __name__ == "__main__":  # exec'd by the bootstrap in __main__, or run as a script
    main()
