"""Sandboxes at soak: N concurrent sandboxes through M episodes of the code env's real tools, with
injected faults; every episode accounted for and nothing left behind. Prints one JSON line per
backend.

    .venv/bin/python bench/soak.py [--backend local|docker|both] [--concurrency 16] [--episodes 500]
                                   [--fault-rate 0.3] [--quick]

An episode is the `code` env (envs/code.py) driven by a script instead of a model: a `python`
call that writes and runs a module, then, in a faulty episode, one injected fault through the
same tool (memory bomb, disk fill past `disk_mb`, fork bomb, a sleep past the timeout, a 100 MB
output flood, or the sandbox killed from the host), a `python` call that must find the sandbox
usable again, and `submit` of the reference solution (graded in a fresh sandbox, reward 1).
Faults are spread evenly over the episodes (`--fault-rate`) and take turns by kind.

Keys: `episodes_ok` (clean), `errors_by_reason` (every other episode by the reason it ended with:
the fault the env observed, `sandbox_dead` for a killed sandbox, `error:<Type>` for anything
else), `episodes_lost` (neither: must be 0), `fault_mismatches` (an injected fault reported as
another kind, or a sandbox not usable after one: must be 0), `leaked_total` (containers,
processes, mounts and work dirs of the run left after it: must be 0), `host_rss_mb_delta` (this
process and its children), `host_disk_mb_delta` (the temp dir's file system; a shared machine
adds noise), and `healthy_throughput_ratio`: healthy episodes per slot-second in the faulty run
over the same in a fault-free run of `--baseline-episodes` in the same invocation (1 / their mean
duration; goal >= 0.8). Exits 1 when an episode is lost, something leaked or a fault was
misreported; a pool that cannot start sandboxes, or a Docker engine that stops answering, ends
the run with one JSON line naming it (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.config import SandboxConfig
from agentrl.parsing import ToolCall
from agentrl.sandboxes import SandboxPool, make_pool
from agentrl.sandboxes.common import (
    FAULT_DEAD,
    FAULT_DISK_FULL,
    FAULT_OOM,
    FAULT_PIDS,
    FAULT_TIMEOUT,
    SandboxDead,
)
from agentrl.sandboxes.local import TEMP_PREFIX
from bench._common import emit, machine_info
from envs.code import CodeEnv

FLOOD = "flood"  # not a fault: the output is cut at max_output_bytes and the episode goes on
INJECTED = (FAULT_OOM, FAULT_DISK_FULL, FAULT_PIDS, FAULT_TIMEOUT, FAULT_DEAD, FLOOD)
FAULT_CODE = {
    FAULT_OOM: "a = []\nwhile True:\n    a.append(b'x' * 2**26)\n",
    FAULT_DISK_FULL: "f = open('/work/fill', 'wb')\nwhile True:\n    f.write(b'x' * 2**20)\n",
    FAULT_PIDS: "import os\nwhile True:\n    os.fork()\n",
    FAULT_TIMEOUT: "import time\ntime.sleep(600)\n",
    FLOOD: "import sys\nchunk = 'x' * 2**20\nfor _ in range(100):\n    sys.stdout.write(chunk)\n",
}
WORK = ("open('mod.py', 'w').write('def f(n):\\n    return sum(i * i for i in range(n))\\n')\n"
        "import mod\nprint(mod.f(1000))\n")
WORK_OUTPUT = str(sum(i * i for i in range(1000)))
# small, so that faults hit fast: a memory bomb must fault in memory_mb + disk_mb of pages before the
# timeout, on a 2-core machine shared by 16 sandboxes and more
LIMITS = {"memory_mb": 128, "disk_mb": 32, "pids": 64, "timeout_s": 10.0}
TOOL_TIMEOUT_S = 10.0  # room for a memory bomb to reach the limit on a loaded machine
EPISODE_TIMEOUT_S = 180.0  # an episode past this is ended and counted as `episode_timeout`
ENGINE_PING_S, ENGINE_MISSES = 5.0, 3  # the Docker engine watchdog: a ping every 5 s, 3 misses end the run


@dataclass
class Outcome:
    reason: str  # "ok", a fault kind, or error:<Type>
    injected: str | None
    seconds: float
    mismatch: str = ""  # what went wrong with an injected fault's report, if anything


class EngineGone(RuntimeError):
    """The Docker engine stopped answering (the watchdog saw ENGINE_MISSES pings fail)."""


def fault_schedule(episodes: int, rate: float) -> list[str | None]:
    """Which fault each episode gets: spread evenly at `rate`, kinds taking turns."""
    plan: list[str | None] = []
    faulty = 0
    for i in range(episodes):
        if int((i + 1) * rate) > int(i * rate):
            plan.append(INJECTED[faulty % len(INJECTED)])
            faulty += 1
        else:
            plan.append(None)
    return plan


async def call(env: CodeEnv, name: str, arguments: dict[str, Any]) -> Any:
    return await env.astep(env.tool_parser.format_call(ToolCall(name, arguments)))


async def episode(env: CodeEnv, task: dict[str, Any], injected: str | None) -> Outcome:
    """One scripted episode; its reason is what the env reported, checked against what was injected."""
    start = time.perf_counter()
    reason, mismatch = "ok", ""
    try:
        await env.areset(task)
        step = await call(env, "python", {"code": WORK})
        if WORK_OUTPUT not in step.observation[0]["content"]:
            mismatch = f"the healthy call went wrong: {step.observation[0]['content'][:200]!r}"
        if injected == FAULT_DEAD:
            await env.sandbox.sandbox.kill()  # the Lease's sandbox, killed from the host
            await call(env, "python", {"code": "print('unreachable')"})  # raises SandboxDead
            mismatch = "a call in a killed sandbox did not end the episode"
        elif injected is not None:
            step = await call(env, "python", {"code": FAULT_CODE[injected]})
            faults = step.info["sandbox_faults"]
            reason = faults[0] if faults else "ok"
            expected = "ok" if injected == FLOOD else injected
            if reason != expected:
                mismatch = f"injected {injected}, reported {reason}: {step.observation[0]['content'][-300:]!r}"
            if injected == FLOOD and "output cut off" not in step.observation[0]["content"]:
                mismatch = "the 100 MB flood was not cut off"
            after = await call(env, "python", {"code": "print('usable ' + str(len(__import__('os').listdir('/tmp'))))"})
            if "usable" not in after.observation[0]["content"] or after.info["sandbox_faults"]:
                mismatch = f"the sandbox was not usable after {injected}: {after.observation[0]['content'][:300]!r}"
        final = await call(env, "submit", {"answer": task["solution"]})
        if not final.terminated or final.info.get("outcome_reward") != 1.0:
            mismatch = mismatch or f"the reference solution was not graded 1.0: {final.info.get('reward_components')}"
    except SandboxDead:
        reason = FAULT_DEAD
    except Exception as e:
        reason = f"error:{type(e).__name__}"
        mismatch = mismatch or f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        await env.aclose()  # gives the sandbox back: reset, or replaced when it died
    return Outcome(reason, injected, time.perf_counter() - start, mismatch)


class Census:
    """What a run may leave behind: containers with its label, child processes, mounts naming its
    temp root or its containers, sandbox work dirs under its temp root."""

    def __init__(self, backend: str, run_id: str, root: Path) -> None:
        self.backend, self.run_id, self.root = backend, run_id, root
        self.container_ids: set[str] = set()  # every container of the run the watchdog saw

    def containers(self, timeout_s: float = 10.0) -> list[str]:
        if self.backend != "docker":
            return []
        import docker  # the docker extra; only for the docker backend

        client = docker.from_env(timeout=timeout_s)  # its own connection: the pool's may all be stuck
        try:
            found = client.api.containers(all=True, filters={"label": f"agentrl.run_id={self.run_id}"})
        finally:
            client.close()
        ids = [c["Id"] for c in found]
        self.container_ids.update(ids)
        return ids

    def leftovers(self) -> dict[str, int]:
        deadline = time.monotonic() + 10.0  # kills and removals finish asynchronously
        while True:
            children = [p for p in psutil.Process().children(recursive=True) if p.is_running()
                        and p.status() != psutil.STATUS_ZOMBIE]
            mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                      if str(self.root) in line or any(cid in line for cid in self.container_ids)]
            counts = {"containers": len(self.containers()), "processes": len(children), "mounts": len(mounts),
                      "work_dirs": len(list(self.root.glob(f"{TEMP_PREFIX}*")))}
            if not any(counts.values()) or time.monotonic() > deadline:
                return counts
            time.sleep(0.5)


def watch_engine(census: Census, stop: threading.Event) -> None:
    """A thread of its own (the event loop's workers may all hang on a dead engine): a ping every
    ENGINE_PING_S; ENGINE_MISSES misses in a row end the process with one line."""
    misses, last = 0, ""
    while not stop.wait(ENGINE_PING_S):
        try:
            census.containers(timeout_s=ENGINE_PING_S)
            misses = 0
        except Exception as e:
            misses, last = misses + 1, f"{type(e).__name__}: {e}"
            if misses >= ENGINE_MISSES:
                emit({"bench": "soak", "backend": census.backend,
                      "error": f"the Docker engine stopped answering ({misses} pings in {misses * ENGINE_PING_S:g} s "
                               f"failed, the last with {last}); the soak stops"})
                shutil.rmtree(census.root, ignore_errors=True)  # os._exit skips main's clean-up
                os._exit(2)


def process_tree_rss_mb() -> float:
    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # it ended meanwhile
            total += proc.memory_info().rss
    return total / 2**20


async def run_episodes(cfg: SandboxConfig, run_id: str, concurrency: int, plan: list[str | None]) -> dict[str, Any]:
    """`len(plan)` episodes on `concurrency` workers sharing one pool of `concurrency` sandboxes."""
    pool: SandboxPool = make_pool(cfg, run_id=run_id, name="soak", size=concurrency)
    tasks = CodeEnv(num_tasks=50).tasks()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(plan)):
        queue.put_nowait(i)
    outcomes: list[Outcome] = []

    async def worker() -> None:
        env = CodeEnv(num_tasks=50, sandbox_pool=pool, tool_timeout_s=TOOL_TIMEOUT_S, max_turns=8)
        while not queue.empty() and not pool.broken:
            i = queue.get_nowait()
            try:
                outcomes.append(await asyncio.wait_for(episode(env, tasks[i % len(tasks)], plan[i]),
                                                       EPISODE_TIMEOUT_S))
            except asyncio.TimeoutError:
                outcomes.append(Outcome("episode_timeout", plan[i], EPISODE_TIMEOUT_S, "episode ran past its deadline"))

    await pool.start()
    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        wall = time.perf_counter() - start
        metrics = pool.metrics()
        await pool.close()
    return {"outcomes": outcomes, "wall_s": wall, "pool": metrics}


def healthy_rate(outcomes: list[Outcome]) -> float:
    """Healthy episodes per slot-second: 1 / their mean duration."""
    healthy = [o.seconds for o in outcomes if o.injected is None and o.reason == "ok"]
    return len(healthy) / sum(healthy) if healthy else 0.0


async def soak(backend: str, concurrency: int, episodes: int, fault_rate: float, baseline: int,
               root: Path, run_id: str) -> dict[str, Any]:
    cfg = SandboxConfig(backend=backend, **LIMITS)  # type: ignore[arg-type]
    census = Census(backend, run_id, root)
    stop = threading.Event()
    if backend == "docker":
        census.containers()  # the engine answers now, or this raises with the reason
        threading.Thread(target=watch_engine, args=(census, stop), daemon=True, name="soak-engine-watch").start()
    rss0, disk0 = process_tree_rss_mb(), shutil.disk_usage(root).used / 2**20
    try:
        clean = await run_episodes(cfg, run_id, concurrency, [None] * baseline)
        faulty = await run_episodes(cfg, run_id, concurrency, fault_schedule(episodes, fault_rate))
    finally:
        stop.set()
    broken = faulty["pool"]["broken"] or clean["pool"]["broken"]
    if broken:
        return {"bench": "soak", "backend": backend, "error": broken}
    outcomes: list[Outcome] = faulty["outcomes"]
    reasons = Counter(o.reason for o in outcomes)
    errors = {k: v for k, v in sorted(reasons.items()) if k != "ok"}
    mismatched = [o for o in outcomes + clean["outcomes"] if o.mismatch]
    examples = {(o.injected, o.reason): f"{o.injected}: {o.mismatch}" for o in reversed(mismatched)}  # one a kind
    leftovers = await asyncio.to_thread(census.leftovers)
    base_rate, fault_rate_healthy = healthy_rate(clean["outcomes"]), healthy_rate(outcomes)
    return {
        "bench": "soak", "backend": backend, "concurrency": concurrency, "episodes": episodes,
        "fault_rate": fault_rate, "episodes_ok": reasons.get("ok", 0), "errors_by_reason": errors,
        "episodes_lost": episodes - sum(reasons.values()),
        "faults_injected": dict(sorted(Counter(o.injected for o in outcomes if o.injected).items())),
        "fault_mismatches": len(mismatched), "fault_mismatch_examples": list(examples.values())[:6],
        "leaked": leftovers, "leaked_total": sum(leftovers.values()),
        "host_rss_mb_delta": round(process_tree_rss_mb() - rss0, 1),
        "host_disk_mb_delta": round(shutil.disk_usage(root).used / 2**20 - disk0, 1),
        "healthy_throughput_ratio": round(fault_rate_healthy / base_rate, 3) if base_rate else None,
        "healthy_episode_s_mean": round(1 / fault_rate_healthy, 3) if fault_rate_healthy else None,
        "baseline_episode_s_mean": round(1 / base_rate, 3) if base_rate else None,
        "baseline_episodes": baseline, "baseline_errors": len(clean["outcomes"]) - sum(
            o.reason == "ok" for o in clean["outcomes"]),
        "episodes_per_s": round(len(outcomes) / faulty["wall_s"], 2),
        "baseline_episodes_per_s": round(len(clean["outcomes"]) / clean["wall_s"], 2),
        "pool": {k: faulty["pool"][k] for k in ("replacements", "replace_failures", "dead_skipped", "failures",
                                                "faults", "startup_p50_ms", "exec_p50_ms", "exec_p99_ms")},
    }


def passed(line: dict[str, Any]) -> bool:
    return (not line.get("error") and line["episodes_lost"] == 0 and line["leaked_total"] == 0
            and line["fault_mismatches"] == 0 and line["baseline_errors"] == 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("local", "docker", "both"), default="both")
    parser.add_argument("--concurrency", type=int, default=16, help="sandboxes (and episodes) at once")
    parser.add_argument("--episodes", type=int, default=500, help="episodes of the faulty run")
    parser.add_argument("--fault-rate", type=float, default=0.3, help="share of episodes with an injected fault")
    parser.add_argument("--baseline-episodes", type=int, default=None,
                        help="episodes of the fault-free run (default: the larger of 2 x concurrency and episodes / 5)")
    parser.add_argument("--run-id", default=f"soak-{uuid.uuid4().hex[:8]}",
                        help="label of the run's containers (`agentrl sandbox prune --run-id` finds them)")
    parser.add_argument("--quick", action="store_true",
                        help="CI size: 4 sandboxes, 12 episodes (each fault kind once), 8 fault-free")
    args = parser.parse_args()
    if args.quick:
        args.concurrency, args.episodes, args.fault_rate, args.baseline_episodes = 4, 12, 0.5, 8
    if args.concurrency < 1 or args.episodes < 1 or not 0 <= args.fault_rate <= 1:
        parser.error("--concurrency and --episodes must be >= 1 and --fault-rate in [0, 1]")
    baseline = args.baseline_episodes or max(2 * args.concurrency, args.episodes // 5)
    backends = ["local", "docker"] if args.backend == "both" else [args.backend]
    root = Path(tempfile.mkdtemp(prefix="agentrl-soak-"))
    root.chmod(0o711)  # bwrap runs as uid 65534 when we are root and must reach the work dirs
    tempfile.tempdir = str(root)  # every sandbox work dir of the run lives here (the census counts them)
    ok = True
    try:
        for backend in backends:
            try:
                line = asyncio.run(soak(backend, args.concurrency, args.episodes, args.fault_rate, baseline, root,
                                        args.run_id))
            except Exception as e:  # no engine, no image, no bwrap: one line naming it
                line = {"bench": "soak", "backend": backend, "error": f"{type(e).__name__}: {e}"}
            emit({**line, "machine": machine_info()})
            if line.get("error"):
                return 2
            ok = ok and passed(line)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
