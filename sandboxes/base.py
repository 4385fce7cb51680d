"""The sandbox protocol (architecture.md §5). Backends: local (bubblewrap), docker, process (no isolation,
explicit opt-in only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    truncated: bool = False
    seconds: float = 0.0
    fault: str | None = None  # one of common.FAULT_KINDS when a sandbox limit ended or hobbled the command

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@runtime_checkable
class Sandbox(Protocol):
    async def exec(self, cmd: str | list[str], timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | bytes | None = None) -> ExecResult: ...

    async def write_file(self, path: str, content: str | bytes) -> None: ...

    async def read_file(self, path: str) -> bytes: ...

    async def upload(self, local_path: str, remote_path: str) -> None: ...

    async def download(self, remote_path: str, local_path: str) -> None: ...

    async def reset(self) -> None: ...

    async def close(self) -> None: ...
