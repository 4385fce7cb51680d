"""The shipped SWE suite (envs/swe/data/suite/): split by whole packages, and a random sample of
its tasks re-validates from scratch (gold patch 1, empty patch 0): 20 on the real local (bubblewrap)
and 5 on the Docker backend. The sample changes with AGENTRL_SWE_SAMPLE_SEED (default: the day)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest

from agentrl.config import SandboxConfig
from agentrl.envs.swe.grade import ValidationCache, validate_tasks
from agentrl.envs.swe.images import ensure_task_image
from agentrl.envs.swe.runtime import task_sandboxes
from agentrl.envs.swe.schema import builtin_tasks

SUITE = builtin_tasks("suite")
SEED = int(os.environ.get("AGENTRL_SWE_SAMPLE_SEED", time.strftime("%Y%m%d")))


def package(task: dict) -> str:
    return task["environment_setup"]["package"]


def sample(n_tasks: int, per_package: int, seed: int) -> list[dict]:
    """`n_tasks` random tasks, at most `per_package` from each of as few random packages as that
    takes (every package costs a runtime or image build; some have fewer tasks than that)."""
    rng = random.Random(seed)
    packages = sorted({package(t) for t in SUITE})
    rng.shuffle(packages)
    tasks: list[dict] = []
    for p in packages:
        group = [t for t in SUITE if package(t) == p]
        tasks += rng.sample(group, min(per_package, len(group), n_tasks - len(tasks)))
        if len(tasks) == n_tasks:
            return tasks
    raise AssertionError(f"the suite has {len(tasks)} tasks, fewer than {n_tasks}")


def revalidate(tasks: list[dict], backend: str, tmp_path: Path) -> list[tuple[str, str]]:
    cfg = SandboxConfig(backend=backend, timeout_s=120.0, memory_mb=2048, pids=256, max_output_bytes=8_000_000)
    cache = ValidationCache(tmp_path / "v.json")  # from scratch: nothing cached

    async def run() -> list[tuple[str, str]]:
        rejected = []
        for p in sorted({package(t) for t in tasks}):
            group = [t for t in tasks if package(t) == p]
            if backend == "docker":
                await asyncio.to_thread(ensure_task_image, group[0], cfg.image)
            async with task_sandboxes(cfg, group[0], min(2, len(group))) as sandboxes:  # two at once, as the CLI
                rejected += (await validate_tasks(group, sandboxes, backend, cache))[1]
        return rejected

    return asyncio.run(run())


def test_the_suite_is_split_by_package() -> None:
    assert len(SUITE) >= 500 and len({package(t) for t in SUITE}) >= 20  # issue 18's scale
    splits: dict[str, set[str]] = {}
    for t in SUITE:
        splits.setdefault(package(t), set()).add(t["split"])
    assert all(len(s) == 1 for s in splits.values()), splits  # a package never straddles splits
    held_out = {p for p, s in splits.items() if s == {"test"}}
    trained = {p for p, s in splits.items() if s == {"train"}}
    assert held_out and trained and not held_out & trained


@pytest.mark.slow
def test_a_random_sample_revalidates_on_local(tmp_path: Path) -> None:
    tasks = sample(20, 5, SEED)
    assert len(tasks) == 20
    assert revalidate(tasks, "local", tmp_path) == [], f"seed {SEED}"


@pytest.mark.slow
@pytest.mark.docker
def test_a_random_sample_revalidates_on_docker(tmp_path: Path) -> None:
    tasks = sample(5, 5, SEED + 1)
    assert len(tasks) == 5
    assert revalidate(tasks, "docker", tmp_path) == [], f"seed {SEED + 1}"
