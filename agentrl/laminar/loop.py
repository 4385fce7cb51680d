"""The trainer loop of the Laminar backend, and the `sync` / `global-async` baselines.

Laminar (arXiv 2510.12633) §3.2 steps ①–⑧; algorithms.md §1.2, §1.5. One code path:

- `laminar`: the prompt pool is open; workers pull new weights whenever they run empty; the
  trainer samples whole groups → `learner.step` → pushes to the master relay → goes on at once.
- `global-async` (one-step-off, stop-the-world update): batch k+1 is released, generated with
  the current weights while the trainer trains on batch k; after the push every worker must
  drain and load the new weights before anything else is released (a global barrier). When step
  k ends, batch k+2 is released too: after a skipped update it runs beside batch k+1.
- `sync` (verl-like): release a batch, wait for it, train, update every engine, repeat.

    summary = run_training(cfg, env_factory, tasks, learner, engines, on_step=print)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agentrl.config import Config
from agentrl.inference.base import InferenceEngine, SamplingParams
from agentrl.inference.cpu.memory import trim_heap
from agentrl.inference.cpu.policy import LearnerStepPolicy, engine_on_idle_cores, learner_beside_engine
from agentrl.inference.cpu.threads import release_idle_workers, to_thread_releasing
from agentrl.laminar.buffer import ExperienceBuffer
from agentrl.laminar.manager import RolloutManager
from agentrl.laminar.partial import PartialResponsePool
from agentrl.laminar.prompts import PromptPool
from agentrl.laminar.relay import Relay, RelayChain, WeightMeta
from agentrl.laminar.runtime import (
    ActorDied,
    LocalRuntime,
    Resources,
    Runtime,
    gather_alive,
    ray_runtime,
    this_node_first,
)
from agentrl.laminar.worker import RolloutWorker
from agentrl.phases import mark_phase, phase
from agentrl.progress import status as run_status
from agentrl.trainer.rewards import DynamicSampler
from agentrl.trainer.weights import weight_views
from agentrl.types import Group, Task

log = logging.getLogger(__name__)

StepCallback = Callable[[dict[str, Any]], Any]
Guide = Callable[[list[Group]], Awaitable[list[Group]]]  # sees each drawn batch of groups first


@dataclass
class LaminarSystem:
    """Every component, as handles (`await h.method(...)`), plus the runtime that made them."""

    runtime: Runtime
    buffer: Any
    prompts: Any
    partial: Any
    chain: RelayChain
    workers: dict[str, Any]
    manager: Any
    backend: str
    started: float = field(default_factory=time.perf_counter)
    engines: list[Any] = field(default_factory=list)  # in-process engine objects (none on Ray)
    # name -> dtype the relays store a weight in: the in-process engines' forward precision, so
    # they share the snapshot instead of holding a cast copy (`rollout_weight_dtypes`)
    weight_dtypes: dict[str, str] = field(default_factory=dict)
    # a LoRA run whose engines apply adapters themselves (vLLM): pushes carry the adapters only
    push_adapters: bool = False


def rollout_weight_dtypes(engines: list[Any]) -> dict[str, str]:
    """The dtypes every in-process engine computes its weights in (`HFEngine.weight_dtypes`);
    empty where there is none, or they differ, or an engine lives elsewhere (a Ray actor copies
    and casts into its own parameters)."""
    plans = [getattr(e, "weight_dtypes", None) if hasattr(e, "generate") else None for e in engines]
    if not plans or any(p is None for p in plans) or any(p != plans[0] for p in plans):
        return {}
    return dict(plans[0])


def resolve_backend(backend: str, num_workers: int, runtime_kind: str) -> str:
    """`laminar.backend=auto`: the fully decoupled Laminar pipeline where it pays (several rollout
    workers, or Ray), one-step-off `global-async` for one local worker. With a single worker and a
    learner slower than generation (2 CPU cores: learn ~150 s, a batch generated in ~55 s), fully
    async generation only grows a backlog that the FIFO buffer hands out oldest first: a measured
    4-step search run trained on nothing but warm-start samples."""
    if backend != "auto":
        return backend
    return "laminar" if num_workers > 1 or runtime_kind == "ray" else "global-async"


async def build_system(cfg: Config, env_factory: Callable[[], Any], tasks: list[Task],
                       engines: list[InferenceEngine] | list[Callable[[], InferenceEngine]],
                       runtime: Runtime | None = None, *, hop_delay_s: float = 0.0,
                       shuffle_prompts: bool = True, resume_state: dict[str, Any] | None = None) -> LaminarSystem:
    """Spawn buffer, prompt pool, partial-response pool, relay chain, workers and manager.

    One worker per entry of `engines` (engine objects locally; zero-argument factories on Ray,
    where each actor builds its own engine). Worker i fetches from relay i mod num_relays.
    """
    rt = runtime or LocalRuntime()
    lam, G = cfg.laminar, cfg.rollout.group_size
    if not engines:
        raise ValueError("run_training needs at least one inference engine (one per rollout worker)")
    backend = resolve_backend(lam.backend, len(engines), rt.kind)
    if rt.kind == "ray" and any(hasattr(e, "generate") for e in engines):
        raise ValueError("on the Ray runtime pass engine factories (each actor builds its own engine)")
    buffer = rt.spawn(ExperienceBuffer, G, capacity=lam.buffer_capacity, max_staleness=lam.max_staleness,
                      seed=cfg.run.seed, name="buffer")
    prompts = rt.spawn(PromptPool, list(tasks), G, seed=cfg.run.seed, shuffle=shuffle_prompts,
                       balance_key=cfg.rollout.balance_key, name="prompts")
    partial = rt.spawn(PartialResponsePool, name="partial")
    if resume_state is not None:  # before any worker takes a prompt
        await prompts.load_state_dict(resume_state["prompts"])
        # groups that were half generated belong to workers that are gone: their prompts are skipped
        await buffer.load_state_dict({**resume_state["buffer"], "pending": {}})
    nodes: list[str] = this_node_first(rt.nodes()) if rt.kind == "ray" else []  # type: ignore[attr-defined]
    if nodes:  # one relay per node, pinned there, the master on the trainer's; workers fetch from their own node's
        relays = [rt.spawn(Relay, f"relay{i}", chunk_bytes=lam.chunk_bytes, hop_delay_s=hop_delay_s,
                           object_store=True, name=f"relay{i}", resources=Resources(node=node))
                  for i, node in enumerate(nodes)]
    else:
        n_relays = max(1, min(lam.num_relays, len(engines)))
        relays = [rt.spawn(Relay, f"relay{i}", chunk_bytes=lam.chunk_bytes, hop_delay_s=hop_delay_s,
                           name=f"relay{i}") for i in range(n_relays)]
    chain = RelayChain(relays)
    await chain.build()

    per_worker = max(1, cfg.rollout.concurrency // G)
    if backend != "laminar":  # spread each released batch over the workers
        per_worker = min(per_worker, math.ceil(cfg.trainer.batch_groups / len(engines)))
    sampling = SamplingParams(temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                              max_tokens=cfg.sampling.max_tokens)
    rollout_kwargs = {"concurrency": cfg.rollout.concurrency,
                      "trajectory_timeout_s": cfg.rollout.trajectory_timeout_s,
                      "max_context_tokens": cfg.rollout.max_context_tokens}
    workers = {}
    worker_res = Resources(num_cpus=lam.worker_num_cpus, num_gpus=lam.worker_num_gpus)
    for i, engine in enumerate(engines):
        name = f"worker{i}"
        workers[name] = rt.spawn(
            RolloutWorker, name, engine, env_factory, relay=relays[i % len(relays)], prompts=prompts,
            buffer=buffer, partial=partial, sampling=sampling, rollout_kwargs=rollout_kwargs,
            groups_per_batch=per_worker, kv_capacity_tokens=cfg.rollout.concurrency * cfg.rollout.max_context_tokens,
            fetch_policy=lam.fetch_policy, portable_state=rt.kind == "ray", name=name, resources=worker_res,
            # one-step-off releases the batch after next on unchanged weights (`_train`): a busy
            # worker starts it beside the current one, up to rollout.concurrency trajectories
            top_up_trajectories=cfg.rollout.concurrency if backend == "global-async" else 0)
    if nodes:  # Ray placed each worker by its resources: point it at its node's relay
        try:
            where = await asyncio.wait_for(asyncio.gather(*(w.node() for w in workers.values())),
                                           lam.wait_timeout_s)
        except asyncio.TimeoutError:
            raise TrainingStalled(
                f"Ray could not place {len(workers)} rollout workers within laminar.wait_timeout_s="
                f"{lam.wait_timeout_s:g} s: each needs {lam.worker_num_cpus:g} CPUs and {lam.worker_num_gpus:g} GPUs "
                "(laminar.worker_num_cpus / worker_num_gpus; sandbox pools take laminar.pool_num_cpus per node)"
            ) from None
        await asyncio.gather(*(w.set_relay(relays[nodes.index(n)]) for w, n in zip(workers.values(), where)))
    await asyncio.gather(*(w.start() for w in workers.values()))
    manager = rt.spawn(RolloutManager, workers, buffer=buffer, prompts=prompts, partial=partial,
                       max_batch=cfg.rollout.concurrency, repack_interval_s=lam.repack_interval_s,
                       name="manager")
    await manager.start()
    return LaminarSystem(rt, buffer, prompts, partial, chain, workers, manager, backend,
                         engines=[e for e in engines if hasattr(e, "generate")],
                         weight_dtypes=rollout_weight_dtypes(list(engines)), push_adapters=engines_take_adapters(cfg))


def engines_take_adapters(cfg: Config) -> bool:
    """A LoRA run on vLLM engines pushes the adapters (a few MB), which vLLM applies beside the base
    weights it loaded itself; the hf engine takes merged weights."""
    return cfg.trainer.lora.rank > 0 and cfg.engine.kind == "vllm"


async def barrier(system: LaminarSystem, version: int, poll_s: float = 0.01) -> float:
    """Stop the world: wait until every live worker runs `version`; returns the seconds waited."""
    t0 = time.perf_counter()
    while True:
        alive = (await system.manager.get_stats())["alive"]
        loads, _ = await gather_alive({n: system.workers[n].load() for n in alive})
        if all(load.version >= version and not load.pulling for load in loads.values()):
            return time.perf_counter() - t0
        await asyncio.sleep(poll_s)


def _learn(learner: Any, groups: list[Group], policy: LearnerStepPolicy) -> dict[str, float]:
    """One learner step under the run's CPU policy (threads, mapped tensors, a trimmed heap after)."""
    with policy.applied(getattr(learner, "model", None)), phase("learner_step"):
        return learner.step(groups)


async def push_weights(system: LaminarSystem, learner: Any, version: int) -> float:
    """Push the learner's weights as `version` to the master relay; returns the copy's seconds.
    A sharded learner (one that describes its weights, `weight_meta`) streams them a gathered
    chunk at a time into the relay's buffer; any other hands over views (or a clone). Engines
    that apply LoRA adapters themselves get the adapters alone (`engines_take_adapters`)."""
    if system.push_adapters:
        return await system.chain.push(await asyncio.to_thread(learner.adapter_views), version, {})
    if hasattr(learner, "weight_meta"):
        metas = [WeightMeta(*m) for m in await asyncio.to_thread(learner.weight_meta)]
        return await system.chain.push_stream(metas, learner.iter_weight_chunks, version, system.weight_dtypes)
    return await system.chain.push(await asyncio.to_thread(weight_views, learner), version, system.weight_dtypes)


class TrainingStalled(RuntimeError):
    """The trainer waited past `laminar.wait_timeout_s`, or every rollout worker is dead."""


async def wait_batch(system: LaminarSystem, n_groups: int, timeout_s: float) -> list[Group]:
    """`buffer.sample(n_groups)` with a deadline; between polls the manager's verdict on the
    workers is checked, so a run whose workers all died fails at once, naming them and why."""
    deadline = time.monotonic() + timeout_s
    poll_s = 0.5  # (the manager learns of a death as it happens; this is how soon the trainer asks)
    while True:
        left = deadline - time.monotonic()
        try:
            return await system.buffer.sample(n_groups, timeout_s=max(0.01, min(poll_s, left)))
        except (asyncio.TimeoutError, TimeoutError):
            pass
        mgr = await system.manager.get_stats()
        why = "; ".join(f"{n}: {mgr['failures'].get(n, 'no answer')}" for n in mgr["dead"])
        if not mgr["alive"]:
            raise TrainingStalled(f"every rollout worker is dead ({why}); no batch can be generated")
        if time.monotonic() >= deadline:
            ready = (await system.buffer.stats())["ready_groups"]
            raise TrainingStalled(
                f"no batch of {n_groups} groups within laminar.wait_timeout_s={timeout_s:g} s ({ready} ready; "
                f"alive workers: {', '.join(mgr['alive'])}; dead: {why or 'none'}); raise "
                "laminar.wait_timeout_s if trajectories are that slow")


async def sample_batch(system: LaminarSystem, n_groups: int, timeout_s: float, dynamic: bool,
                       max_gen_batches: int, release_more: bool, guide: Guide | None = None
                       ) -> tuple[list[Group], dict[str, float]]:
    """One training batch. With DAPO dynamic sampling, groups whose rewards are all equal are
    dropped and the batch is refilled from the buffer (the baselines release that many more
    prompts first), at most `max_gen_batches` draws in all (≤ 0: no limit). Unlike verl, running
    out of draws does not end the run: the step trains on the groups kept (none: it is skipped).
    `guide` sees every draw first (agentrl/guidance.py adds a demonstration to unsolved groups)."""
    guided = 0

    async def draw(n: int) -> list[Group]:
        nonlocal guided
        groups = await wait_batch(system, n, timeout_s)
        if guide is None:
            return groups
        groups = await guide(groups)
        guided += sum(any(t.demonstrated for t in g.trajectories) for g in groups)
        return groups

    if not dynamic:
        groups = await draw(n_groups)
        return groups, ({"guided_groups": float(guided)} if guide is not None else {})
    sampler: DynamicSampler[Group] = DynamicSampler(n_groups, lambda g: g.rewards, max_gen_batches, strict=False)
    ready = sampler.add(await draw(n_groups))
    while not ready and not sampler.exhausted:
        missing = n_groups - len(sampler.kept)
        if release_more:
            await system.prompts.allow(missing, min_version=await _buffer_version(system))
        ready = sampler.add(await draw(missing))
    metrics = {"dapo_dropped_groups": float(sampler.num_dropped), "dapo_gen_batches": float(sampler.num_gen_batches)}
    if guide is not None:
        metrics["guided_groups"] = float(guided)
    if sampler.exhausted:
        metrics["dapo_short_batch"] = float(n_groups - len(sampler.kept))
        log.warning("dynamic sampling: %d of %d groups had a reward spread after %d draws "
                    "(trainer.max_gen_batches); this step trains on those", len(sampler.kept), n_groups,
                    sampler.num_gen_batches)
    return sampler.take(), metrics


async def share_first_snapshot(system: LaminarSystem, version: int, timeout_s: float = 60.0) -> None:
    """In-process engines take the relay's first snapshot as their weights (HFEngine shares a
    read-only snapshot instead of copying it). Their workers would not pull it (they already run
    version `version`, loaded from disk), so without this a one-process run would hold the engine's
    own copy and the relay's for as long as no step trains. Engine i reads relay i mod n, as its
    worker does; the engines are idle (nothing is released before this push)."""
    relays = system.chain.relays
    for i, engine in enumerate(system.engines):
        if not getattr(engine, "shares_read_only_weights", False):  # one that copies (vLLM, a server): no gain
            continue
        snap = await relays[i % len(relays)].fetch_latest(version - 1, "wait_inflight", timeout_s)
        if snap is not None and snap.version == version:
            await engine.load_weights(snap.state_dict(), version)
    if system.engines:
        trim_heap()


async def drop_finished_prefixes(system: LaminarSystem) -> None:
    """Release the KV the in-process engines keep for next turns (HFEngine.drop_prefixes) once the
    trainer holds its batch, on the batch-at-a-time backends: every trajectory of that batch has
    finished, so nothing will extend those prefixes, yet the store would hold them through the
    learner step until the weight swap drops them. (`laminar` keeps them: its rollouts never stop.)"""
    freed = 0
    for engine in system.engines:
        drop = getattr(engine, "drop_prefixes", None)
        if drop is not None:
            freed += await drop()
    if freed:
        trim_heap()


async def _buffer_version(system: LaminarSystem) -> int:
    return int((await system.buffer.stats())["version"])


async def train(system: LaminarSystem, learner: Any, steps: int, batch_groups: int,
                on_step: StepCallback | None = None, *, wait_timeout_s: float = 1800.0,
                dynamic_sampling: bool = False, max_gen_batches: int = 10,
                guide: Guide | None = None, mmap_threshold_mb: float | None = None) -> dict[str, Any]:
    """Run `steps` global-batch updates; returns the run summary (see `summarize`).
    `mmap_threshold_mb`: `trainer.mmap_threshold_mb` (inference/cpu/policy.py)."""
    release_idle_workers()  # the event loop's thread loaded the models: its OpenMP workers would throttle the engine's
    with engine_on_idle_cores(system.engines):
        return await _train(system, learner, steps, batch_groups, on_step, wait_timeout_s=wait_timeout_s,
                            dynamic_sampling=dynamic_sampling, max_gen_batches=max_gen_batches, guide=guide,
                            mmap_threshold_mb=mmap_threshold_mb)


async def _train(system: LaminarSystem, learner: Any, steps: int, batch_groups: int,
                 on_step: StepCallback | None, *, wait_timeout_s: float, dynamic_sampling: bool,
                 max_gen_batches: int, guide: Guide | None = None,
                 mmap_threshold_mb: float | None = None) -> dict[str, Any]:
    backend = system.backend
    if backend not in ("laminar", "sync", "global-async"):
        raise ValueError(f"unknown backend {backend!r}; expected 'laminar', 'sync' or 'global-async'")
    policy = LearnerStepPolicy.for_run(backend, system.engines, getattr(learner, "model", None), mmap_threshold_mb)
    v = learner.version
    with phase("push"):
        await push_weights(system, learner, v)  # relays start from v
        await share_first_snapshot(system, v)
    await system.buffer.set_version(v)
    await system.prompts.allow(None if backend == "laminar" else batch_groups, min_version=v)
    released = 1  # batches released so far (global-async counts them)

    async def release_through(last: int) -> None:
        """global-async: release batches up to index `last` (never past the final step's: a batch
        nobody trains on would take cores from the last update), on the current weights."""
        nonlocal released
        while released <= min(last, steps - 1):
            await system.prompts.allow(batch_groups, min_version=v)
            released += 1

    records: list[dict[str, Any]] = []
    for step in range(steps):
        t0 = time.perf_counter()
        mark_phase("rollout")  # the trainer waits for a batch (bench/memory.py's timeline)
        groups, dapo = await sample_batch(system, batch_groups, wait_timeout_s, dynamic_sampling,
                                          max_gen_batches, release_more=backend != "laminar", guide=guide)
        wait_s = time.perf_counter() - t0
        ahead = backend == "global-async" and released > step + 1  # the next batch is out already
        if backend != "laminar" and not ahead:  # (its trajectories may extend kept prefixes)
            await drop_finished_prefixes(system)  # before the next batch is released
        # The cursors to resume from (taken before the next batch is released: on `sync` they
        # point exactly past this batch; on `laminar`, and on `global-async` when `ahead`, the
        # groups in flight now are skipped).
        resume_state = {"prompts": await system.prompts.state_dict(), "buffer": await system.buffer.cursor()}
        if backend == "global-async":  # the next batch overlaps this update
            await release_through(step + 1)
        t1 = time.perf_counter()
        with learner_beside_engine(backend, system.engines):
            metrics = await to_thread_releasing(_learn, learner, groups, policy)
        learn_s = time.perf_counter() - t1
        updated = learner.version != v  # a batch with nothing trainable leaves the weights alone
        v = learner.version
        t2 = time.perf_counter()
        mark_phase("push")
        # the copy runs off the event loop: heartbeats and the manager keep ticking meanwhile;
        # views (or a sharded learner's gathered chunks), not a clone, go into the relay's buffer
        t3 = time.perf_counter()
        push_copy_s = await push_weights(system, learner, v) if updated else 0.0
        pushed_at = time.perf_counter()
        stall_s = pushed_at - t3  # what the trainer waits for weights: the copy (and a sharded learner's gathers)
        await system.buffer.set_version(v)
        sync_s = 0.0
        if backend != "laminar" and updated:
            mark_phase("sync")
            sync_s = await barrier(system, v)
        mark_phase("rollout")
        if backend == "sync":  # also after a skipped step (nothing trainable): the run must go on
            await system.prompts.allow(batch_groups, min_version=v)
        elif backend == "global-async":
            # One-step-off's bound: a batch is generated at most one update before it is trained.
            # Every step before step + 1 is done, so the batch after next, released now on the
            # current weights, sees at most step + 1's update before its own step. After an update
            # the barrier has drained the next batch, so this only starts what the following step
            # would have; after a skipped update (every group's rewards equal) the next batch may
            # still be generating, and the two share the engine's decode steps.
            await release_through(step + 2)
        await system.manager.trigger()
        trajs = [t for g in groups for t in g.trajectories if not t.demonstrated]  # the policy's own
        versions = [group_version(g) for g in groups]
        stale = [t.finished_version - gv for g, gv in zip(groups, versions) if gv is not None
                 for t in g.trajectories if not t.demonstrated and t.finished_version is not None]
        rec = {"step": step, "version": v, "backend": backend, "trainer_wait_s": wait_s,
               "learn_s": learn_s, "push_stall_s": stall_s, "push_copy_s": push_copy_s,
               "pushed_at": pushed_at, "state_dict_s": t3 - t2,
               "weight_sync_s": sync_s, "groups": len(groups), "trajectories": len(trajs),
               "group_versions": versions,
               "staleness_mean": sum(stale) / len(stale) if stale else 0.0,
               "staleness_max": max(stale, default=0),
               "reward_mean": sum(t.reward for t in trajs) / max(1, len(trajs)),
               "time_s": time.perf_counter() - system.started, **dapo,
               **{f"learner/{k}": val for k, val in metrics.items()}}
        records.append(rec)
        if on_step is not None:  # the callback also sees the groups themselves (not kept in records)
            out = on_step({**rec, "batch": groups, "resume_state": resume_state})
            if asyncio.iscoroutine(out):
                await out
    return await summarize(system, records)


def group_version(group: Group) -> int | None:
    """The weight version of a group from the buffer, read off one policy-generated member: the
    buffer admits only groups of one version, and `Trajectory.version` scans every token, so
    reading it off each member (`Group.version`) costs G times as much."""
    own = next((t for t in group.trajectories if not t.demonstrated and t.version is not None), None)
    return own.version if own is not None else None


async def summarize(system: LaminarSystem, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Trainer idle, rollout idle, staleness histogram, repack moves, weight pull latency."""
    wall = time.perf_counter() - system.started
    worker_stats, dead = await gather_alive({n: w.get_stats() for n, w in system.workers.items()})
    relay_stats = {}
    for r in system.chain.relays:
        with contextlib.suppress(ActorDied):
            relay_stats[r.name] = await r.get_stats()
    buf = await system.buffer.stats()
    mgr = await system.manager.get_stats()
    pulls = [s for w in worker_stats.values() for _, s in w["pulls"]]
    trained = sum(r["trajectories"] for r in records)
    hist: Counter[int] = Counter()
    for k, val in buf["staleness_hist"].items():
        hist[int(k)] += val
    return {
        "backend": system.backend, "runtime": system.runtime.kind, "steps": len(records),
        "final_version": records[-1]["version"] if records else None, "wall_s": wall,
        "trajectories_trained": trained, "trajectories_per_s": trained / wall if wall else 0.0,
        "trainer_idle_s": sum(r["trainer_wait_s"] + r["weight_sync_s"] for r in records),
        "train_s": sum(r["learn_s"] for r in records),
        "push_stall_s": [r["push_stall_s"] for r in records],
        "broadcast_s": {n: s["broadcast_s"] for n, s in relay_stats.items()},
        # what a push carries (engines_take_adapters) and its size in each relay
        "weight_push": "lora adapters" if system.push_adapters else "weights",
        "relay_snapshot_bytes": {n: s["snapshot_bytes"] for n, s in relay_stats.items()},
        "rollout_idle_s": {n: w["idle_s"] for n, w in worker_stats.items()},
        "weight_pull_s": pulls, "staleness_hist": dict(sorted(hist.items())),
        "repack_moves": mgr["repack_moves"], "repack_rounds": mgr["repack_rounds"], "moves": mgr["moves"],
        "repack_decision_s": await system.manager.decision_times(),
        "repack_decision_cpu_s": await system.manager.decision_times(cpu=True),
        "dead_workers": mgr["dead"] + [d for d in dead if d not in mgr["dead"]],
        "restarted": mgr["restarted"], "regenerated_groups": mgr["regenerated_groups"],
        "buffer": {k: v for k, v in buf.items() if k != "staleness_hist"},
        "workers": worker_stats, "records": records,
    }


async def shutdown(system: LaminarSystem) -> None:
    await system.manager.stop()
    for w in system.workers.values():
        with contextlib.suppress(ActorDied):
            await w.stop()
    await system.runtime.shutdown()


# Allocations between collections of the youngest generation (Python's default: 700), and the
# counts that promote a collection to the next generation (default 10, 10).
GC_THRESHOLDS = (20_000, 50, 100)


@contextlib.contextmanager
def collector_for_a_long_run() -> Iterator[None]:
    """Python's cyclic collector, set for the training loop. What exists when the loop starts (the
    model, tokenizers, every worker and its rollout engine) lives as long as the run: it is frozen out
    of the collector's reach. The loop allocates tasks, coroutines and token lists fast, and at the
    default thresholds every few hundred allocations start a collection while full ones walk every
    trajectory in flight: at 1,024 workers the collector took 2.3 CPU-s per 1,000 trajectories, three
    times the controller's own work, and stretched repack decisions to 18 ms at p99; at these, 0.37
    and 4 ms (bench/controller.py, gc_cpu_s_per_1k; a young generation of 100,000 cut the CPU further
    but its collections, 10 ms each, landed inside repack decisions). Garbage waits for at most
    20,000 allocations; the loop itself makes no reference cycles (rollout/engine.py breaks its one)."""
    gc.collect()
    gc.freeze()
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()  # the run is over: a process that goes on collects it as usual


async def run_training_async(cfg: Config, env_factory: Callable[[], Any], tasks: list[Task], learner: Any,
                             engines: list[Any], on_step: StepCallback | None = None,
                             runtime: Runtime | None = None,
                             resume_state: dict[str, Any] | None = None,
                             guide: Guide | None = None) -> dict[str, Any]:
    own = runtime is None and cfg.laminar.ray_address is not None
    if own:  # "local": a cluster of this machine; "auto" or an address: a running cluster
        runtime = ray_runtime(cfg)
    try:
        system = await build_system(cfg, env_factory, tasks, engines, runtime, resume_state=resume_state)
        run_status.watch(system)  # the progress display polls the in-flight trajectories (agentrl/progress.py)
        try:
            with collector_for_a_long_run():
                return await train(system, learner, cfg.trainer.steps, cfg.trainer.batch_groups, on_step,
                                   wait_timeout_s=cfg.laminar.wait_timeout_s,
                                   dynamic_sampling=cfg.trainer.dynamic_sampling,
                                   max_gen_batches=cfg.trainer.max_gen_batches, guide=guide,
                                   mmap_threshold_mb=cfg.trainer.mmap_threshold_mb)
        finally:
            run_status.watch(None)  # nothing to poll once the actors are gone
            await shutdown(system)
    finally:
        if own:
            runtime.close()  # type: ignore[union-attr]


def run_training(cfg: Config, env_factory: Callable[[], Any], tasks: list[Task], learner: Any,
                 engines: list[Any], on_step: StepCallback | None = None,
                 runtime: Runtime | None = None) -> dict[str, Any]:
    """Train with `cfg.laminar.backend` ('laminar', 'sync' or 'global-async'); `on_step`
    receives each step's metrics dict. Returns the run summary. Runtime: `runtime`, else Ray
    actors when `cfg.laminar.ray_address` is set (engines must then be factories), else local."""
    return asyncio.run(run_training_async(cfg, env_factory, tasks, learner, engines, on_step, runtime))
