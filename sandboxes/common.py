"""Pieces every backend shares: resource limits, errors, the truncation marker, paths."""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.config import SandboxConfig

WORKDIR = "/work"  # the sandbox's writable work dir, as seen from inside (every backend)
KILLED_EXIT = 128 + 9  # shell convention for "killed by SIGKILL"; also what `timeout -s KILL` returns


class SandboxError(RuntimeError):
    """A sandbox could not do what was asked (bad path, closed sandbox, engine failure)."""


class SandboxTimeout(SandboxError, TimeoutError):
    """No sandbox became free in time (pool acquisition)."""


class SandboxDead(SandboxError):
    """The sandbox itself is gone (its agent or container died, or stopped answering): nothing the
    command did can be reported, and the sandbox must be replaced."""

    fault = "sandbox_dead"


# What can go wrong with a command beyond its own exit status, as ExecResult.fault names it. Each is
# established from the kernel's own accounting where the backend exposes it (see agent.classify).
FAULT_OOM = "oom"  # out of memory: killed by the memory cgroup, or an allocation refused by RLIMIT_AS
FAULT_DISK_FULL = "disk_full"  # a write hit ENOSPC on /work or /tmp (sandbox.disk_mb, the /tmp share of memory)
FAULT_PIDS = "pids"  # a fork or thread was refused at the process limit (sandbox.pids)
FAULT_TIMEOUT = "timeout"  # the command ran past its wall clock and was killed
FAULT_DEAD = SandboxDead.fault  # the sandbox died under the command
FAULT_KINDS = (FAULT_OOM, FAULT_DISK_FULL, FAULT_PIDS, FAULT_TIMEOUT, FAULT_DEAD)


@dataclass(frozen=True)
class Limits:
    """Per-sandbox hard limits. `timeout_s` is the default per-exec wall clock."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    cpus: float = 1.0
    pids: int = 64
    max_output_bytes: int = 1_000_000  # per stream (stdout and stderr each)
    file_size_mb: int = 512
    disk_mb: int = 1024  # size of the /work tmpfs (a quota that holds on every backend, see docs/threat_model.md)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"sandbox limit '{f.name}' must be > 0, got {value!r}")

    @classmethod
    def from_config(cls, cfg: SandboxConfig) -> Limits:
        return cls(timeout_s=cfg.timeout_s, memory_mb=cfg.memory_mb, cpus=cfg.cpus, pids=cfg.pids,
                   max_output_bytes=cfg.max_output_bytes, file_size_mb=cfg.file_size_mb,
                   disk_mb=getattr(cfg, "disk_mb", cls.disk_mb))

    def cpu_seconds(self, timeout: float) -> int:
        """CPU-time rlimit for one exec: the wall-clock budget times the cores, plus a second of slack."""
        return math.ceil(timeout * max(self.cpus, 1.0)) + 1


def truncation_marker(omitted: int) -> str:
    return f"\n[... output truncated: {omitted} more bytes omitted ...]\n"


def to_bytes(content: str | bytes) -> bytes:
    if isinstance(content, str):
        return content.encode()
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    raise TypeError(f"file content must be str or bytes, got {type(content).__name__}")


def inside_path(path: str, cwd: str = WORKDIR) -> str:
    """A sandbox path made absolute (relative paths are under `cwd`) and normalised."""
    if not isinstance(path, str) or not path:
        raise SandboxError(f"sandbox path must be a non-empty string, got {path!r}")
    return posixpath.normpath(posixpath.join(cwd, path))
