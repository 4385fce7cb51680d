"""Failures a user can act on, and the one line the CLI prints for any failure.

    raise UserError("no Docker engine answers", fix="start one: sudo scripts/docker_up.sh")

The CLI (agentrl/cli.py) prints `agentrl COMMAND: PROBLEM; fix: FIX` and exits 1 for a UserError,
2 for a ConfigError (bad usage or config: nothing was started), and 1 with a one-line summary for
anything else; `--debug` adds the full traceback. `explain` knows a few exception types raised by
the layers below (sandboxes, task files, sockets, HTTP) so they need not import this module.
"""

from __future__ import annotations

import errno
import sys
import traceback


class UserError(RuntimeError):
    """A run-time failure with a known remedy: the message names the problem, `fix` the remedy."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.problem}; fix: {self.fix}" if self.fix else self.problem


def one_line(text: str, limit: int = 600) -> str:
    """Collapse a message onto one line and cap it, so a CLI error never becomes a screen."""
    flat = " | ".join(part.strip() for part in str(text).splitlines() if part.strip())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def where(exc: BaseException) -> str:
    """' (at FILE:LINE)' of the innermost frame an exception (or the one it chains from) passed through."""
    inner = exc.__cause__ or exc
    if isinstance(inner, SyntaxError) and inner.filename:
        return f" (at {inner.filename}:{inner.lineno})"
    frames = traceback.extract_tb(inner.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _is(exc: BaseException, module: str, name: str) -> bool:
    """isinstance against a class of a module only if that module is already loaded: an error from
    a layer that never ran cannot be of its types, and explaining must not import heavy code."""
    mod = sys.modules.get(module)
    cls = getattr(mod, name, None) if mod is not None else None
    return isinstance(cls, type) and isinstance(exc, cls)


def explain(exc: BaseException) -> tuple[int, str]:
    """(exit code, one line naming the problem and the fix) for an exception reaching the CLI."""
    if _is(exc, "agentrl.config", "ConfigError"):
        return 2, one_line(str(exc))
    if isinstance(exc, UserError):
        return 1, one_line(str(exc))
    if _is(exc, "agentrl.sandboxes.common", "SandboxError"):
        # The sandbox layer's messages name the missing binary, engine or image and how to get it.
        return 1, one_line(str(exc))
    if _is(exc, "agentrl.envs.swe.schema", "TaskError"):
        return 1, one_line(f"bad task file: {exc}; fix the record it names, then check the file with "
                           "`agentrl swe validate FILE`")
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return 1, one_line(f"a port is already in use ({exc}); stop the process listening there "
                           "(`ss -ltnp` shows it) or configure another port")
    if _is(exc, "httpx", "ConnectError") or _is(exc, "httpx", "ConnectTimeout"):
        url = getattr(getattr(exc, "request", None), "url", "the server")
        return 1, one_line(f"cannot reach {url} ({exc}); start the server or fix engine.base_url")
    if isinstance(exc, MemoryError):
        return 1, "out of memory; lower rollout.concurrency, rollout.group_size, trainer.micro_batch_size or trainer.micro_batch_tokens"
    if isinstance(exc, FileNotFoundError):
        return 1, one_line(str(exc))  # a path the user gave: the message names it
    return 1, one_line(f"{type(exc).__name__}: {exc}{where(exc)}; unexpected: run again with --debug for the "
                       "traceback and report it")
