"""Sandbox latency and throughput. Prints one JSON line.

    .venv/bin/python bench/sandbox.py [--quick]

local_exec_*: `true` in a started bubblewrap sandbox; local_cold_start: bwrap + agent start + first
exec; docker_warm_exec: `true` in a running container; docker_cold_start: container create + start
+ agent + first exec; *_reset: reset() after a lease that left files and a background process;
pool_acquire: acquisition from a warm pool (Docker when an engine answers,
else local); concurrent_execs_per_s: 64 short execs (acquire, exec, release with reset) through a
pool of 8. Targets on the 2-core dev machine: local exec p50 <= 15 ms, docker warm p50 <= 150 ms,
pool acquire p50 <= 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.config import SandboxConfig
from agentrl.sandboxes import SandboxPool, make_pool, make_sandbox
from agentrl.sandboxes.pool import percentile
from bench._common import emit, machine_info


async def timed(fn: Callable[[], Awaitable[object]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


async def exec_latency(cfg: SandboxConfig, n: int) -> list[float]:
    sb = make_sandbox(cfg, run_id="bench")
    try:
        await sb.exec("true")  # warm: start the container / run the one-time probe
        return await timed(lambda: sb.exec("true"), n)
    finally:
        await sb.close()


async def reset_latency(cfg: SandboxConfig, n: int) -> list[float]:
    """reset() after a lease that left files in /work, /tmp and /dev/shm and a background process:
    kill every process but the agent, wipe, restore the tmpfs mounts, drop SysV IPC."""
    sb = make_sandbox(cfg, run_id="bench")
    samples = []
    try:
        for _ in range(n):
            await sb.exec("mkdir -p a/b && echo x > a/b/f && echo y > /tmp/t && echo z > /dev/shm/s; sleep 100 &")
            start = time.perf_counter()
            await sb.reset()
            samples.append((time.perf_counter() - start) * 1000)
        return samples
    finally:
        await sb.close()


async def cold_start(cfg: SandboxConfig, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        sb = make_sandbox(cfg, run_id="bench")
        await sb.exec("true")
        samples.append((time.perf_counter() - start) * 1000)
        await sb.close()  # not part of the start-up figure
    return samples


async def pool_figures(cfg: SandboxConfig, n_acquire: int) -> tuple[list[float], float]:
    """(acquire latencies in ms, execs/s for 64 short execs from 64 concurrent users on a pool of 8)."""
    pool: SandboxPool = make_pool(cfg, run_id="bench", name="bench", size=8, health_interval_s=None)
    await pool.start()
    try:
        acquire_ms = []
        for _ in range(n_acquire):
            start = time.perf_counter()
            lease = await pool.get(timeout=60)
            acquire_ms.append((time.perf_counter() - start) * 1000)
            await pool.put(lease)

        async def user() -> None:
            async with pool.acquire(timeout=120) as sb:
                await sb.exec("echo hi")

        start = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(64)))
        return acquire_ms, 64 / (time.perf_counter() - start)
    finally:
        await pool.close()


def docker_ready(image: str) -> bool:
    try:
        from agentrl.sandboxes.docker import docker_client

        docker_client().images.get(image)
        return True
    except Exception:
        return False


async def main(quick: bool) -> dict[str, object]:
    n = 40 if quick else 200
    local, docker = SandboxConfig(backend="local"), SandboxConfig(backend="docker")
    out: dict[str, object] = {"bench": "sandbox", "quick": quick, "cpus": os.cpu_count()}
    lat = await exec_latency(local, n)
    out["local_exec_p50_ms"] = round(percentile(lat, 50), 2)
    out["local_exec_p99_ms"] = round(percentile(lat, 99), 2)
    out["local_cold_start_p50_ms"] = round(percentile(await cold_start(local, 5 if quick else 20), 50), 1)
    out["local_reset_p50_ms"] = round(percentile(await reset_latency(local, n // 2), 50), 2)
    acquire, rate = await pool_figures(local, n)
    out["local_pool_acquire_p50_ms"] = round(percentile(acquire, 50), 3)
    out["local_concurrent_execs_per_s"] = round(rate, 1)
    if docker_ready(docker.image):
        lat = await exec_latency(docker, n // 2)
        out["docker_warm_exec_p50_ms"] = round(percentile(lat, 50), 2)
        out["docker_warm_exec_p99_ms"] = round(percentile(lat, 99), 2)
        cold = await cold_start(docker, 3 if quick else 10)
        out["docker_cold_start_p50_ms"] = round(percentile(cold, 50), 1)
        out["docker_reset_p50_ms"] = round(percentile(await reset_latency(docker, n // 4), 50), 2)
        acquire, rate = await pool_figures(docker, n // 2)
        out["pool_backend"] = "docker"
    else:
        out["docker"] = "unavailable (run sudo scripts/docker_up.sh)"
        out["pool_backend"] = "local"
    out["pool_acquire_p50_ms"] = round(percentile(acquire, 50), 3)
    out["pool_acquire_p99_ms"] = round(percentile(acquire, 99), 3)
    out["concurrent_execs_per_s"] = round(rate, 1)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples; under a minute")
    args = parser.parse_args()
    emit({**asyncio.run(main(args.quick)), "machine": machine_info()})  # load average at the end
