"""Chaos on the `--ray local` path (issue 15), with the hf engine built by `make_engine` inside each
rollout worker actor and real bubblewrap sandboxes from the node's sandbox pool actor:

- SIGKILL of one rollout worker's OS process mid-step: the run finishes its steps, every trained
  group is whole, the dead worker's trajectories are handed on (restarted or regenerated whole),
  the buffer's counts add up, its sandbox leases come back, and no process outlives the run;
- SIGKILL of the driver (`agentrl train --ray local` as a subprocess) mid-run: within a short
  grace period no Ray process (GCS, raylet, agents, actors), bwrap sandbox or local sandbox dir
  of the run is left (the runtime's reaper, agentrl/laminar/runtime.py).

The run's processes are found by ancestry (and by a tag in their environment, which every process
the run starts inherits, though Ray's `setproctitle` overwrites it in many): other test sessions
may run Ray and sandboxes on the same machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from agentrl.config import load_config  # noqa: E402
from agentrl.env_builder import make_env  # noqa: E402
from agentrl.laminar.cluster import RemoteEngine, loop_runtime, ray_session  # noqa: E402
from agentrl.laminar.loop import build_system, shutdown, train  # noqa: E402
from agentrl.models import resolve_configured  # noqa: E402
from agentrl.sandboxes.ray_pool import ACTOR_PREFIX  # noqa: E402
from agentrl.trainer.distributed import make_learner  # noqa: E402

from .helpers import (  # noqa: E402
    CHAOS_TAG,
    bwrap_under,
    check_single_version,
    descendants,
    process_table,
    still_alive,
    tagged_pids,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

GRACE_S = 20.0  # how long the run's processes may take to go once it ended or its driver died
# tiny: two tokens of thought per turn are enough to exercise every box (tests/test_train_e2e.py)
TINY = ["trainer.batch_groups=1", "rollout.group_size=2", "rollout.concurrency=2", "sampling.max_tokens=24",
        "env.max_turns=2", "trainer.micro_batch_size=2", "sandbox.backend=local", "sandbox.pool_size=2",
        "trainer.warm_start.enabled=false", "eval.enabled=false", "laminar.num_workers=2"]


def _kind(cmd: str) -> str:
    """'raylet', 'gcs_server', 'ray::RolloutWorker', ... from a command line."""
    return (cmd.split() or [""])[0].rsplit("/", 1)[-1].split(".")[0]


def _gone_within(grace_s: float, check) -> object:
    """Poll `check()` (what is still there) until it is empty or `grace_s` passed; its last answer."""
    deadline = time.monotonic() + grace_s
    left = check()
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = check()
    return left


async def test_sigkill_of_a_rollout_worker_process_mid_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not ray.is_initialized(), "needs a Ray cluster of its own (`--ray local`)"
    tag = uuid.uuid4().hex
    monkeypatch.setenv(CHAOS_TAG, tag)  # inherited by every process Ray starts for this run
    steps = 3
    cfg = load_config(env="code", overrides=[*TINY, f"trainer.steps={steps}", "laminar.ray_address=local",
                                             "laminar.wait_timeout_s=300",
                                             f"run.dir={tmp_path}", "run.name=chaos"])
    G = cfg.rollout.group_size
    # what agentrl/run.py builds for `agentrl train --env code --ray local`
    learner = make_learner(resolve_configured(cfg.model), cfg.trainer, temperature=cfg.sampling.temperature,
                           reward_cfg=cfg.reward)
    tasks = list(make_env(cfg, None).tasks("train"))[:16]
    engines = [RemoteEngine(cfg) for _ in range(cfg.laminar.num_workers)]  # each actor calls make_engine(cfg)
    seen: list = []
    step = learner.step
    learner.step = lambda groups: (seen.append(list(groups)), step(groups))[1]
    killed: dict = {}
    system = None

    async def kill_a_busy_worker(rec: dict) -> None:
        """After step 0 (the workers are mid-trajectory: the prompt pool is open), SIGKILL the OS
        process of a worker that holds trajectories."""
        if killed:
            return
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for name, w in system.workers.items():
                if (await w.load()).n_reqs == 0:
                    continue
                pid = await w.pid()
                assert pid != os.getpid()
                lost = [e.traj_id for e in await system.partial.of_worker(name)]
                table = process_table()
                killed.update(name=name, pid=pid, lost=lost, table=table, bwrap=bwrap_under({pid}, table))
                os.kill(pid, signal.SIGKILL)
                return
            await asyncio.sleep(0.05)
        raise AssertionError("no worker held a trajectory for 120 s")

    t0 = time.monotonic()
    before = descendants({os.getpid()})  # this process's children that are not the run's
    seen_bwrap: dict[int, tuple[int, str]] = {}
    run_procs: dict[int, tuple[int, str]] = {}
    async with ray_session(cfg) as ray_rt, loop_runtime(cfg, "chaos", lambda: make_env(cfg, None), make_env,
                                                        ray_rt) as (runtime, env_factory, _pools):
        assert runtime is not None and runtime.kind == "ray" and runtime.started_ray
        system = await build_system(cfg, env_factory, tasks, engines, runtime)
        try:
            summary = await asyncio.wait_for(train(system, learner, steps, cfg.trainer.batch_groups,
                                                   kill_a_busy_worker, wait_timeout_s=cfg.laminar.wait_timeout_s),
                                             600)
            table = process_table()  # the run's processes and sandboxes, to check after it ended
            run_procs = {p: table[p] for p in (descendants({os.getpid()}, table) - before) | set(tagged_pids(tag))
                         if p in table}
            seen_bwrap = {p: table[p] for p in bwrap_under(set(run_procs), table)}
            left_with_dead = await system.partial.of_worker(killed["name"])
        finally:
            await shutdown(system)
        pools = [ray.get_actor(f"{ACTOR_PREFIX}-{node}") for node in runtime.nodes()]
        # a dead process's leases come back at the pool's next reap (every second): allow a few
        deadline = time.monotonic() + 10
        while True:
            pool_metrics = [await p.metrics.remote() for p in pools]
            leases = sum(m["leases"] for m in pool_metrics)
            if leases == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        reclaimed = sum(m["reclaimed"] for m in pool_metrics)
    ran_s = time.monotonic() - t0

    # the run finished its steps, on the surviving worker
    assert killed, "no worker was killed"
    assert summary["steps"] == steps and len(seen) == steps, summary["steps"]
    assert summary["dead_workers"] == [killed["name"]], summary["dead_workers"]
    assert killed["pid"] not in process_table() or still_alive({killed["pid"]}, killed["table"]) == set()
    # no group trained half, none twice, one weight version per group
    groups = [g for batch in seen for g in batch]
    assert groups and all(len(g.trajectories) == G for g in groups), [len(g.trajectories) for g in groups]
    ids = [t.id for g in groups for t in g.trajectories]
    assert len(ids) == len(set(ids))
    assert len({g.id for g in groups}) == len(groups)
    check_single_version(groups)
    # the dead worker's in-flight trajectories were handed on: restarted on the live worker (same
    # ids) or their groups dropped and regenerated whole; none is left with the dead worker
    assert killed["lost"], "the killed worker held trajectories"
    assert left_with_dead == []
    assert summary["restarted"] + summary["regenerated_groups"] >= 1, summary
    regenerated = {g.id.split("~r")[0] for g in groups if "~r" in g.id}
    trained_lost = [t for t in killed["lost"] if t in ids or t.rsplit("/", 1)[0] in regenerated]
    # counts add up: everything written was consumed, dropped, evicted or is still waiting
    buf = summary["buffer"]
    assert buf["trajectories_written"] == (buf["trajectories_consumed"] + buf.get("trajectories_dropped", 0)
                                           + buf.get("trajectories_evicted", 0) + buf["ready_trajectories"]
                                           + buf["pending_trajectories"]), buf
    assert buf["trajectories_consumed"] == len(ids)
    # the sandboxes the dead worker leased from its node's pool came back to the pool
    assert leases == 0, f"{leases} sandbox lease(s) still out after every worker stopped"
    # nothing outlives the run: no Ray process, no sandbox (bwrap dies with its parent)
    assert not killed["bwrap"] or not still_alive(killed["bwrap"], killed["table"])
    kinds = {_kind(cmd) for _, cmd in run_procs.values()}
    assert {"gcs_server", "raylet", "ray::RolloutWorker", "ray::OwnedSandboxPool"} <= kinds, kinds
    left = _gone_within(GRACE_S, lambda: still_alive(set(run_procs), run_procs) | set(tagged_pids(tag)))
    assert not left, f"outlived the run: {[process_table().get(p) for p in left]}"
    assert not _gone_within(GRACE_S, lambda: still_alive(set(seen_bwrap), seen_bwrap))
    print(f"\nchaos: killed {killed['name']} (pid {killed['pid']}) holding {len(killed['lost'])} trajectories; "
          f"{len(trained_lost)} of them trained later; restarted {summary['restarted']}, regenerated groups "
          f"{summary['regenerated_groups']}; {reclaimed} sandbox lease(s) taken back; {len(groups)} whole groups trained in {ran_s:.0f} s")


def test_sigkill_of_the_driver_leaves_nothing_behind(tmp_path: Path) -> None:
    """`agentrl train --env code --ray local`, SIGKILLed mid-run: nothing of the run survives it."""
    tag = uuid.uuid4().hex
    env = {**os.environ, CHAOS_TAG: tag}
    log = tmp_path / "driver.log"
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "code", "--ray", "local", "trainer.steps=50",
           f"run.dir={tmp_path}", "run.name=crash", *TINY, "--quiet"]
    with open(log, "wb") as out:
        driver = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    metrics = tmp_path / "crash" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 480
        while True:  # mid-run: a step is done and both rollout workers are generating
            assert driver.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not get going:\n" + log.read_text()[-3000:]
            workers = [p for p, c in tagged_pids(tag).items() if c.startswith("ray::RolloutWorker")]
            if metrics.exists() and metrics.read_text().strip() and len(workers) == 2:
                break
            time.sleep(1)
        table = process_table()
        procs = (descendants({driver.pid}, table) | set(tagged_pids(tag))) & set(table)
        sandboxes = bwrap_under(procs | {driver.pid}, table)
        kinds = {_kind(table[p][1]) for p in procs}
        assert {"gcs_server", "raylet", "ray::RolloutWorker", "ray::OwnedSandboxPool"} <= kinds, kinds
        assert sandboxes, "the run's sandbox pools hold bwrap sandboxes"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(30)
        killed_at = time.monotonic()
        left = _gone_within(GRACE_S, lambda: still_alive(procs, table) | set(tagged_pids(tag)))
        gone_s = time.monotonic() - killed_at
        assert not left, f"outlived the driver by {GRACE_S:g} s: {[process_table().get(p) for p in left]}"
        assert not _gone_within(GRACE_S, lambda: still_alive(sandboxes, table))
        dirs = _gone_within(GRACE_S, lambda: [d for p in procs | {driver.pid}
                                              for d in glob.glob(f"/tmp/agentrl-sbx-{p}-*")])
        assert not dirs, f"local sandbox dirs of the dead run: {dirs}"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        print(f"\ndriver killed after {len(rows)} step(s); {len(procs)} processes and {len(sandboxes)} sandboxes "
              f"gone {gone_s:.1f} s later")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(30)
        for pid in tagged_pids(tag):  # never leave the machine dirty, whatever failed above (best effort)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
