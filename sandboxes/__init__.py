"""Sandboxes (architecture.md §5): where agent-written code runs.

    sb = make_sandbox(cfg.sandbox)                     # one sandbox (local bubblewrap by default)
    pool = make_pool(cfg.sandbox, run_id=run_id)       # a warm pool of cfg.sandbox.pool_size
    await pool.start()
    async with pool.acquire(timeout=30) as sb:
        result = await sb.exec("python3 -c 'print(42)'", timeout=5)

Backends: `local` (bubblewrap, default), `docker` (Docker SDK; needs the `docker` extra and an
engine), `process` (no isolation; only when asked for by name).
"""

from __future__ import annotations

from typing import Any

from agentrl.config import SandboxConfig

from .base import ExecResult, Sandbox
from .common import Limits, SandboxError, SandboxTimeout
from .local import LocalSandbox, ProcessSandbox
from .pool import Lease, SandboxPool

BACKENDS = ("local", "docker", "process")
DEFAULT_POOL_SIZE = 4  # a SandboxConfig built by hand, not by load_config (which sizes it to rollout.concurrency)

__all__ = [
    "BACKENDS",
    "ExecResult",
    "Lease",
    "Limits",
    "LocalSandbox",
    "ProcessSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "SandboxTimeout",
    "make_pool",
    "make_sandbox",
]


def make_sandbox(cfg: SandboxConfig | None = None, run_id: str | None = None, pool: str = "default") -> Sandbox:
    """One sandbox of the configured backend. Nothing starts until its first use or `await sb.start()`."""
    if cfg is None:
        cfg = SandboxConfig()
    limits = Limits.from_config(cfg)
    if cfg.backend == "local":
        return LocalSandbox(limits)
    if cfg.backend == "process":
        return ProcessSandbox(limits)
    if cfg.backend == "docker":
        from .docker import DockerSandbox  # optional: the Docker SDK

        return DockerSandbox(cfg.image, limits, run_id=run_id, pool=pool, read_only=cfg.read_only_root)
    raise ValueError(f"unknown sandbox backend {cfg.backend!r}; choose one of {', '.join(BACKENDS)}")


def make_pool(cfg: SandboxConfig | None = None, run_id: str | None = None, name: str = "default",
              size: int | None = None, **pool_kwargs: Any) -> SandboxPool:
    """A warm pool of `size` (default cfg.pool_size, else DEFAULT_POOL_SIZE) sandboxes; call
    `await pool.start()` to warm it."""
    if cfg is None:
        cfg = SandboxConfig()
    if cfg.backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {cfg.backend!r}; choose one of {', '.join(BACKENDS)}")
    if cfg.backend == "docker":  # a wedged engine breaks the pool at once (lazy: as make_sandbox)
        from .docker import engine_ping  # optional: the Docker SDK

        pool_kwargs.setdefault("liveness", engine_ping)
    return SandboxPool(lambda: make_sandbox(cfg, run_id=run_id, pool=name), size or cfg.pool_size or DEFAULT_POOL_SIZE,
                       name=name, **pool_kwargs)
