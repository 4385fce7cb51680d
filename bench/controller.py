"""Laminar's controller at cluster scale, measured on the real components (issue 56).

    python bench/controller.py --quick               # 64 workers, one step, a 64 MB fan-out; CI runs this
    python bench/controller.py                       # 64, 256, 1024 workers; fan-out of 3 GB to 1/8/64
    python bench/controller.py --sizes 64 --ray 8    # also the fan-out to 8 Ray worker actors (copies per node)

What is real and what is modelled. The run is `agentrl train`'s Laminar loop: `run_training_async`
builds the buffer, prompt pool, partial-response pool, relay, rollout workers (each with the real
`RolloutEngine` and the embedded model's tokenizer) and manager through the same factory, and
trains through the same `train`. Only the GPUs are stood in for, and nothing else:

- `ModelledEngine` "generates" a turn after length / decode rate seconds (lognormal lengths with
  the paper's median 2,600 tokens and p99/p50 = 10 per response, split over the turns; an H100's
  per-sequence decode rate for a 7B model) and costs no CPU while it waits. It returns one token
  per `--token-scale` modelled tokens (the controller counts tokens, never reads them).
- `ModelledLearner` sleeps its step time off the event loop and hands over a state dict of
  `--state-mb` bf16 bytes (views, as the real learner's `state_dict_views`).
- `ModelledEnv` is a cheap multi-turn env whose tool calls sleep a lognormal latency.

Every modelled delay and the manager's repack period are divided by `--speedup`, so
the controller sees `--speedup` times the event rate of a real cluster of that size while its
costs per trajectory stay what they would be.

Controller CPU by component. Each component is called through a runtime handle; the handles here
tag every call (and every task a call starts) with its component, and every event-loop callback's
CPU time (`time.thread_time`) is charged to the component that runs in it. `workers` (the rollout
engines and envs) is what runs on the GPU nodes in a cluster; the controller is the rest: relay,
manager, buffer, pools (prompt and partial-response), loop (the trainer loop and the event loop's
own overhead) and the threads that copy weights into the relay.

Relay fan-out. Pushes of a real state dict (`--fanout-gb`, default 3 GB: a 1.5B-parameter bf16
model) to 1, 8 and 64 pulling workers on one node: wall time from a push to the last worker
holding the weights, GB/s against this machine's memcpy, and how many full copies the node holds
afterwards (resident memory grown, divided by the state dict's size; the relay's lazily freed
spare apart). The figures are those of a push a learner step after the one before, the steady
state of a run: the first push writes into new pages (`first_push_*`), later ones into the
buffer the workers let go of.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import gc
import json
import math
import os
import random
import re
import resource
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.config import Config, load_config
from agentrl.inference.base import GenerateOutput, SamplingParams
from agentrl.laminar.loop import run_training_async
from agentrl.laminar.relay import Relay, RelayChain
from agentrl.laminar.runtime import LocalHandle, LocalRuntime, RayRuntime, Resources
from agentrl.models import load_tokenizer, resolve_model
from agentrl.progress import status as run_status
from agentrl.types import Group, Message, StepResult
from bench._common import emit, git_commit, load_average

SHARE = os.environ.get("AGENTRL_BENCH_RELAY_STORE", "1") == "1"  # 0: the relay without the object store (before)
LAMINAR_SIM = Path(__file__).resolve().parent / "laminar_sim.py"

# ---------------------------------------------------------------------------------------------
# The stand-ins for the GPUs
# ---------------------------------------------------------------------------------------------


class Workload:
    """The modelled cluster's timings (seconds already divided by the speedup)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.median_tokens = args.median_tokens
        self.sigma = args.length_sigma
        self.max_tokens = args.max_response_tokens
        self.decode_tok_s = args.decode_tok_s
        self.turns = args.turns
        self.tool_s = args.tool_s
        self.speedup = args.speedup
        self.token_scale = args.token_scale
        self.pcie_gb_s = args.pcie_gb_s

    def response_tokens(self, rng: random.Random) -> int:
        """One trajectory's response length: lognormal, median and p99/p50 as in the paper's Fig. 2."""
        return min(self.max_tokens, max(1, int(rng.lognormvariate(math.log(self.median_tokens), self.sigma))))

    def tool_delay(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(self.tool_s), 0.5) / self.speedup if self.tool_s > 0 else 0.0


class ModelledEngine:
    """An InferenceEngine whose turns take modelled GPU time and no CPU (see the module's doc)."""

    def __init__(self, tokenizer: Any, workload: Workload, seed: int) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = frozenset({tokenizer.eos_token_id})
        self.version = 0
        self.workload = workload
        self.rng = random.Random(seed)
        self.token = tokenizer.encode(" ok", add_special_tokens=False)[0]
        self.weights: dict[str, Any] | None = None
        self.turns = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput:
        w = self.workload
        tokens = w.response_tokens(self.rng) / w.turns  # this turn's share of a response
        await asyncio.sleep(tokens / w.decode_tok_s / w.speedup)
        n = max(1, min(sampling.max_tokens, round(tokens / w.token_scale)))
        self.turns += 1
        return GenerateOutput([self.token] * n, [-1.0] * n, "length", self.version)

    async def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Keep the relay's views (a GPU engine copies them into device memory: the PCIe time is
        modelled, host memory is not touched again)."""
        nbytes = sum(t.numel() * t.element_size() for t in state_dict.values())
        await asyncio.sleep(nbytes / (self.workload.pcie_gb_s * 1e9) / self.workload.speedup)
        self.weights, self.version = state_dict, version

    async def close(self) -> None:
        self.weights = None


class ModelledEnv:
    """A multi-turn env: task["turns"] actions, each tool call sleeping a modelled latency."""

    name = "modelled"

    def __init__(self, workload: Workload, seed: int) -> None:
        self.workload = workload
        self.rng = random.Random(seed)
        self.turn = 0
        self.turns = 1

    async def areset(self, task: dict[str, Any]) -> list[Message]:
        self.turn, self.turns = 0, int(task["turns"])
        return [Message(role="system", content="Use the tool."), Message(role="user", content=f"Task {task['id']}.")]

    async def astep(self, action: str) -> StepResult:
        self.turn += 1
        await asyncio.sleep(self.workload.tool_delay(self.rng))
        done = self.turn >= self.turns
        reward = float(self.rng.random() < 0.5)
        return StepResult(observation=[] if done else [Message(role="tool", content=f"result {self.turn}")],
                          terminated=done, info={"outcome_reward": reward} if done else {})


class EnvFactory:
    """Zero-argument env factory (picklable: a Ray worker builds its envs with it)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.made = 0

    def __call__(self) -> ModelledEnv:
        self.made += 1
        return ModelledEnv(self.workload, self.made)


class ModelledLearner:
    """Learner-shaped: `step` sleeps the modelled step time on its thread (no CPU) and moves the
    version; its weights are `state_mb` of bf16 tensors handed over as views."""

    def __init__(self, state_bytes: int, step_s: float, tensor_bytes: int = 64 * 2**20) -> None:
        self.version = 0
        self.step_s = step_s
        self.steps: list[int] = []  # trajectories per step
        sizes = [tensor_bytes] * (state_bytes // tensor_bytes) + ([state_bytes % tensor_bytes] if state_bytes % tensor_bytes else [])
        self.weights = {f"layers.{i}.weight": torch.ones(n // 2, dtype=torch.bfloat16) for i, n in enumerate(sizes)}

    def step(self, groups: list[Group]) -> dict[str, float]:
        time.sleep(self.step_s)
        self.steps.append(sum(len(g.trajectories) for g in groups))
        self.version += 1
        return {"loss": 0.0}

    def state_dict_views(self) -> dict[str, torch.Tensor]:
        return self.weights

    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        return self.weights


# ---------------------------------------------------------------------------------------------
# CPU time by component
# ---------------------------------------------------------------------------------------------

COMPONENT: contextvars.ContextVar[str] = contextvars.ContextVar("component", default="loop")


def component_of(handle_name: str) -> str:
    for prefix, comp in (("relay", "relay"), ("worker", "workers"), ("prompts", "pools"), ("partial", "pools"),
                         ("buffer", "buffer"), ("manager", "manager")):
        if handle_name.startswith(prefix):
            return comp
    return handle_name


class CpuMeter:
    """Charges the event-loop thread's CPU time to the component running in each callback."""

    def __init__(self) -> None:
        self.cpu: Counter[str] = Counter()
        self.callbacks: Counter[str] = Counter()  # event-loop callbacks run per component
        self.current = "eventloop"
        self.last = time.thread_time()
        self.calls: Counter[str] = Counter()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self._run: Any = None

    def switch(self, to: str) -> None:
        now = time.thread_time()
        self.cpu[self.current] += now - self.last
        self.last, self.current = now, to

    def install(self) -> None:
        """Wrap asyncio's callback runner (a bench-only instrument: `Handle._run` is private)."""
        run = self._run = asyncio.events.Handle._run
        meter = self

        def accounted_run(handle: Any) -> None:
            ctx = handle._context
            comp = ctx.get(COMPONENT, "loop") if ctx is not None else "loop"
            meter.callbacks[comp] += 1
            meter.switch(comp)
            try:
                run(handle)
            finally:
                meter.switch("eventloop")  # between callbacks: asyncio's own scheduling and polling

        asyncio.events.Handle._run = accounted_run  # type: ignore[method-assign]

    def by_component(self) -> dict[str, float]:
        """CPU seconds per component, the event loop's own time shared out by callbacks run."""
        cpu = {c: v for c, v in self.cpu.items() if c != "eventloop"}
        total = sum(self.callbacks.values()) or 1
        for c, n in self.callbacks.items():
            cpu[c] = cpu.get(c, 0.0) + self.cpu["eventloop"] * n / total
        return cpu

    def uninstall(self) -> None:
        if self._run is not None:
            asyncio.events.Handle._run = self._run  # type: ignore[method-assign]
            self._run = None


class GcMeter:
    """The CPU seconds Python's cyclic garbage collector takes (it is charged above to whichever
    component allocated when a collection started), and how many full collections ran."""

    def __init__(self) -> None:
        self.cpu_s, self.full, self._t0 = 0.0, 0, 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
        else:
            self.cpu_s += time.thread_time() - self._t0
            self.full += info["generation"] == 2

    def uninstall(self) -> None:
        gc.callbacks.remove(self._on_gc)


class AccountedHandle(LocalHandle):
    """A LocalHandle whose calls (and the tasks they start) run as its component."""

    meter: CpuMeter

    def __getattr__(self, method: str) -> Any:
        call = super().__getattr__(method)
        comp, meter, obj = component_of(self.name), self.meter, self._obj

        async def accounted(*args: Any, **kwargs: Any) -> Any:
            meter.calls[f"{comp}.{method}"] += 1
            token = COMPONENT.set(comp)
            meter.switch(comp)
            timed = (comp, method) in (("buffer", "write"), ("buffer", "sample"))
            ready = timed and method == "sample" and len(obj._ready) >= (args[0] if args else kwargs["n_groups"])
            t0 = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                if timed and (method == "write" or ready):  # a sample that waited for groups is not a hand-off
                    meter.latency[f"buffer_{method}"].append(time.perf_counter() - t0)
                COMPONENT.reset(token)
                meter.switch(COMPONENT.get())

        return accounted


class AccountedRuntime(LocalRuntime):
    """The local runtime, handing out AccountedHandles."""

    def __init__(self, meter: CpuMeter) -> None:
        super().__init__()
        self.meter = meter

    def spawn(self, cls: type, *args: Any, name: str, resources: Resources | None = None, **kwargs: Any) -> Any:
        token = COMPONENT.set(component_of(name))
        try:
            handle = AccountedHandle(cls(*args, **kwargs), name)
        finally:
            COMPONENT.reset(token)
        handle.meter = self.meter
        self.handles.append(handle)
        return handle


# ---------------------------------------------------------------------------------------------
# One controller run
# ---------------------------------------------------------------------------------------------


async def progress_display(tick_s: float) -> None:
    """What `agentrl train`'s progress line does beside the loop (run.py's `_Progress.run`): read
    the in-flight trajectories every tick (a second, divided by the speedup)."""
    while True:
        await asyncio.sleep(tick_s)
        await run_status.poll()


def run_config(args: argparse.Namespace, workers: int) -> Config:
    G = args.group_size
    return load_config(overrides=[
        "laminar.backend=laminar", f"laminar.num_workers={workers}", "laminar.num_relays=1",
        f"laminar.repack_interval_s={5.0 / args.speedup}",
        "laminar.wait_timeout_s=600", f"laminar.buffer_capacity={max(256, 4 * args.batch_groups(workers))}",
        f"rollout.group_size={G}", f"rollout.concurrency={args.per_worker}",
        f"rollout.max_context_tokens={args.max_response_tokens // args.token_scale + 1024}",
        f"sampling.max_tokens={args.max_response_tokens // args.token_scale + 1}",
        f"trainer.batch_groups={args.batch_groups(workers)}", f"trainer.steps={args.steps}",
        "run.quiet=true",
    ])


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1)]


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 3)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def controller_run(args: argparse.Namespace, workers: int) -> dict[str, Any]:
    workload = Workload(args)
    tokenizer = load_tokenizer(resolve_model("smollm2-135m"))
    cfg = run_config(args, workers)
    tasks = [{"id": f"t{i}", "turns": args.turns} for i in range(max(64, args.batch_groups(workers) * 4))]
    learner = ModelledLearner(int(args.state_mb * 2**20), args.step_s / args.speedup)
    engines = [ModelledEngine(tokenizer, workload, seed=i) for i in range(workers)]
    gc.collect()
    rss0 = rss_mb()
    meter = CpuMeter()
    meter.install()
    collector = GcMeter()
    cpu0, wall0, thread0 = time.process_time(), time.perf_counter(), time.thread_time()
    display = asyncio.ensure_future(progress_display(1.0 / args.speedup))
    try:
        summary = await run_training_async(cfg, EnvFactory(workload), tasks, learner, engines,
                                           runtime=AccountedRuntime(meter))
    finally:
        display.cancel()
        meter.switch("eventloop")
        meter.uninstall()
        collector.uninstall()
    wall = time.perf_counter() - wall0
    process_cpu = time.process_time() - cpu0
    cpu = meter.by_component()
    # off the event loop: the relay's push copies and the learner step's bookkeeping
    cpu["threads"] = process_cpu - (time.thread_time() - thread0)
    trained = summary["trajectories_trained"]
    admitted = summary["buffer"].get("trajectories_written", 0)
    controller = {c: cpu.get(c, 0.0) for c in ("relay", "manager", "buffer", "pools", "loop", "threads")}
    controller_s = sum(controller.values())
    per_1k = 1000 / max(1, admitted)
    mgr = summary
    decisions = await_free(summary, "repack_decision_s")
    decisions_cpu = await_free(summary, "repack_decision_cpu_s")
    pulls = summary["weight_pull_s"]
    turns = sum(e.turns for e in engines)
    rates = {k: round(v / wall, 1) for k, v in sorted(meter.calls.items())}
    by_comp: Counter[str] = Counter()
    for k, v in meter.calls.items():
        by_comp[k.split(".")[0]] += v
    return {
        "workers": workers, "runtime": "local", "in_flight_target": workers * args.per_worker,
        "steps": summary["steps"], "wall_s": round(wall, 2),
        "trajectories_admitted": admitted, "trajectories_trained": trained,
        "trajectories_per_s": round(admitted / wall, 2), "trajectories_trained_per_s": round(trained / wall, 2),
        "controller_cpu_s_per_1k": round(controller_s * per_1k, 4),
        "controller_cpu_s_per_1k_by_component": {c: round(v * per_1k, 4) for c, v in controller.items()},
        "workers_cpu_s_per_1k": round(cpu.get("workers", 0.0) * per_1k, 4),
        "controller_cores": round(controller_s / wall, 3), "process_cores": round(process_cpu / wall, 3),
        "controller_capacity_trajectories_per_s": round(admitted / controller_s, 1) if controller_s else None,
        "repack_p50_ms": ms(percentile(decisions, 50)), "repack_p99_ms": ms(percentile(decisions, 99)),
        "repack_cpu_p50_ms": ms(percentile(decisions_cpu, 50)), "repack_cpu_p99_ms": ms(percentile(decisions_cpu, 99)),
        "repack_decisions": len(decisions), "repack_moves": mgr["repack_moves"],
        "weight_pull_p50_ms": ms(percentile(pulls, 50)), "weight_pull_p99_ms": ms(percentile(pulls, 99)),
        "handoff_p50_ms": ms(percentile(meter.latency["buffer_write"], 50)),
        "handoff_p99_ms": ms(percentile(meter.latency["buffer_write"], 99)),
        "sample_ready_p99_ms": ms(percentile(meter.latency["buffer_sample"], 99)),
        "gc_cpu_s_per_1k": round(collector.cpu_s * per_1k, 4), "gc_full_collections": collector.full,
        "peak_rss_mb": round(peak_rss_mb(), 1), "rss_grown_mb": round(rss_mb() - rss0, 1),
        "rss_mb_per_worker": round(max(0.0, peak_rss_mb() - rss0) / workers, 3),
        "events_per_s": {c: round(v / wall, 1) for c, v in sorted(by_comp.items())},
        "engine_turns_per_s": round(turns / wall, 1), "calls_per_s": rates,
        "learner_steps": len(learner.steps),
    }


def await_free(summary: dict[str, Any], key: str) -> list[float]:
    """The manager's per-round figures from the run summary (the manager's stats)."""
    return list(summary.get(key, []))


# ---------------------------------------------------------------------------------------------
# Relay fan-out with real bytes
# ---------------------------------------------------------------------------------------------


def memcpy_gb_s(nbytes: int, fresh: bool = False) -> float:
    """This machine's single-thread memcpy bandwidth, best of 3 over `nbytes`: into a buffer whose
    pages are faulted in, or (`fresh`) into a newly allocated one, which is what a push into a new
    buffer costs at best (first-touch page faults: on a VM they can be several times a memcpy)."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    best = math.inf
    for _ in range(3):
        if fresh:
            del dst
            dst = torch.empty(nbytes, dtype=torch.uint8)
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


LEARNER_STEP_S = 1.0


def state_dict_of(nbytes: int) -> dict[str, torch.Tensor]:
    return ModelledLearner(nbytes, 0.0, tensor_bytes=256 * 2**20).weights


class PullingWorker:
    """What a rollout worker does with the relay (`RolloutWorker._pull`): fetch the newest
    snapshot from its node's relay, and keep its state dict as its engine's weights."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] | None = None

    async def ready(self) -> int:
        return os.getpid()

    async def pull(self, relay: Any, have: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        snap = await relay.fetch_latest(have, "wait_inflight")
        snap = await snap.resolve()
        self.weights = snap.state_dict()
        return os.getpid(), time.perf_counter() - t0


def private_mb(pids: list[int], lazy_free: bool = False) -> float:
    """The private pages of these processes that the kernel can not take back (Ray's object store,
    a /dev/shm file they map, is counted apart: `store_mb`); with `lazy_free`, only those it can:
    pages advised MADV_FREE, the relay's spare (`agentrl/laminar/host_buffers.py`)."""
    private = lazy = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps") as f:
            in_store = False
            for line in f:
                head = line.split(None, 5)
                if "-" in head[0] and not head[0].endswith(":"):  # a mapping's header
                    in_store = len(head) == 6 and "/dev/shm/plasma" in head[5]
                elif not in_store and head[0] in ("Private_Clean:", "Private_Dirty:"):
                    private += int(head[1])
                elif not in_store and head[0] == "LazyFree:":
                    lazy += int(head[1])
    return (lazy if lazy_free else private - lazy) / 1024


def store_mb() -> float:
    """The bytes of the live objects in Ray's object store (0 without Ray)."""
    if "ray" not in sys.modules or not sys.modules["ray"].is_initialized():
        return 0.0
    from ray._private.internal_api import memory_summary  # Ray's own figure (`ray memory --stats-only`)

    # This run's own cluster by address: another Ray instance on the machine makes the default ambiguous.
    address = sys.modules["ray"].get_runtime_context().gcs_address
    match = re.search(r"Plasma memory usage (\d+) MiB", memory_summary(address=address, stats_only=True))
    return float(match.group(1)) if match else 0.0


def node_mb(pids: list[int]) -> float:
    """Memory these processes hold, each page once: their private pages and the store's objects."""
    return private_mb(pids) + store_mb()


def ray_node_pids() -> list[int]:
    """This process and every process Ray started under it (object store and actors included)."""
    table = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError), open(f"/proc/{name}/stat", "rb") as f:
            table[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
    pids, grew = {os.getpid()}, True
    while grew:
        new = {p for p, pp in table.items() if pp in pids} - pids
        grew, pids = bool(new), pids | new
    return sorted(pids)


async def fanout(runtime: Any, nbytes: int, n_workers: int) -> dict[str, Any]:
    """Push `nbytes` of weights to one relay and let `n_workers` pull them; copies per node."""
    relay = runtime.spawn(Relay, "relay0", name="relay0", resources=Resources(num_cpus=0.01),
                          object_store=runtime.kind == "ray" and SHARE)
    chain = RelayChain([relay])
    await chain.build()
    pullers = [runtime.spawn(PullingWorker, name=f"worker{i}", resources=Resources(num_cpus=0.01))
               for i in range(n_workers)]
    await asyncio.gather(relay.ping(), *(w.ready() for w in pullers))  # every process is up
    # a first, small push: every process has loaded what a pull needs before anything is counted
    await chain.push(state_dict_of(2**20), 1)
    await asyncio.gather(*(w.pull(relay, 0) for w in pullers))
    sd = state_dict_of(nbytes)
    gc.collect()
    pids = ray_node_pids() if runtime.kind == "ray" else [os.getpid()]
    before, spare_before = node_mb(pids), private_mb(pids, lazy_free=True)
    each = {pid: private_mb([pid]) for pid in pids}

    async def push_and_pull(version: int) -> tuple[float, float, list[tuple[int, float]]]:
        t0 = time.perf_counter()
        copy_s = await chain.push(sd, version)
        pulled = await asyncio.gather(*(w.pull(relay, version - 1) for w in pullers))
        return time.perf_counter() - t0, copy_s, pulled

    # The first push writes into new pages; from the third on, a push writes into the buffer the
    # workers let go of when they pulled the one before. In a run a learner step separates two
    # pushes (LEARNER_STEP_S, far shorter than any real step): the figures are that push's. Right
    # after a pull (`back_to_back_*`) the push first waits for the released pages to be advised.
    cold_wall, _, _ = await push_and_pull(2)
    await push_and_pull(3)
    back_to_back_wall, _, _ = await push_and_pull(4)
    await asyncio.sleep(LEARNER_STEP_S)
    wall, copy_s, pulled = await push_and_pull(5)
    relay_stats = await relay.get_stats()
    gc.collect()
    await asyncio.sleep(1.0)  # Ray frees the push's argument copy once the call's references are gone
    pids = ray_node_pids() if runtime.kind == "ray" else [os.getpid()]
    grown = node_mb(pids) - before
    spare = private_mb(pids, lazy_free=True) - spare_before
    if os.environ.get("AGENTRL_BENCH_DEBUG"):  # which process holds what
        for pid in pids:
            with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
                print(f"{pid} {private_mb([pid]) - each.get(pid, 0.0):9.1f} MB  {f.read()[:40]!r}", file=sys.stderr)
    return {"workers": n_workers, "runtime": runtime.kind, "bytes": nbytes, "wall_s": round(wall, 4),
            "push_copy_s": round(copy_s, 4), "gb_per_s": round(nbytes / wall / 1e9, 3),
            "first_push_gb_per_s": round(nbytes / cold_wall / 1e9, 3),
            "back_to_back_gb_per_s": round(nbytes / back_to_back_wall / 1e9, 3),
            "copies_per_node": round(grown * 2**20 / nbytes, 3),
            "lazily_freed_copies_per_node": round(spare * 2**20 / nbytes, 3),
            "relay_buffers_reused": relay_stats["buffers_reused"], "relay_served_as_pushed": relay_stats["served_as_pushed"],
            "pull_p99_ms": ms(percentile([s for _, s in pulled], 99)),
            "worker_processes": len({p for p, _ in pulled})}


async def fanout_in_process(nbytes: int, n_workers: int, ray: bool) -> dict[str, Any]:
    """One fan-out on a fresh runtime (a fresh process: the allocator has nothing freed to reuse,
    so the memory grown is the copies made)."""
    rt = RayRuntime(num_cpus=max(2, os.cpu_count() or 1)) if ray else LocalRuntime()
    try:
        return await fanout(rt, nbytes, n_workers)
    finally:
        await rt.shutdown()
        if ray:
            rt.close()


def fanout_suite(nbytes: int, counts: list[int], ray: bool) -> dict[str, Any]:
    bw = memcpy_gb_s(min(nbytes, 512 * 2**20))
    fresh_bw = memcpy_gb_s(min(nbytes, 512 * 2**20), fresh=True)
    runs = []
    for n in counts:
        cmd = [sys.executable, __file__, "--fanout-one", str(n), "--fanout-gb", str(nbytes / 1e9),
               *(["--ray", "1"] if ray else [])]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            sys.stderr.write(out.stderr[-4000:])
            raise SystemExit(f"the fan-out to {n} workers failed (exit {out.returncode})")
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for r in runs:
        r["gb_per_s_over_memcpy"] = round(r["gb_per_s"] / bw, 3)
        r["gb_per_s_over_fresh_memcpy"] = round(r["gb_per_s"] / fresh_bw, 3)
    return {"memcpy_gb_per_s": round(bw, 3), "fresh_memcpy_gb_per_s": round(fresh_bw, 3), "runs": runs}


# ---------------------------------------------------------------------------------------------
# The simulator's figure for the paper's 1024-GPU 7B run
# ---------------------------------------------------------------------------------------------


def paper_rate_1024(quick: bool) -> float:
    """Trajectories a second bench/laminar_sim.py predicts for Laminar on 1,024 GPUs with 7B."""
    cmd = [sys.executable, str(LAMINAR_SIM), "--gpus", "1024", "--model", "7B", "--systems", "laminar", "--quick"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900)
    lam = json.loads(out.stdout.strip().splitlines()[-1])["systems"]["laminar"]
    return 512 * 16 / lam["iteration_s"]  # the paper's batch: 512 prompts x 16 trajectories a step


# ---------------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 workers, 1 step, a 64 MB fan-out to 8 workers")
    ap.add_argument("--sizes", default=None, help="comma-separated worker counts (default 64,256,1024)")
    ap.add_argument("--ray", type=int, default=0, metavar="N", help="also push to N worker actors on a local Ray cluster and count the node's copies "
                    "(the controller runs themselves are on the local runtime)")
    ap.add_argument("--steps", type=int, default=None, help="learner steps per size (default 4; --quick 2)")
    ap.add_argument("--per-worker", type=int, default=16, help="trajectories in flight per worker")
    ap.add_argument("--group-size", type=int, default=16, help="trajectories per prompt (the paper's 16)")
    ap.add_argument("--batch-share", type=float, default=0.5,
                    help="groups per step per worker (the paper's 512 groups at 1,024 GPUs: 0.5)")
    ap.add_argument("--median-tokens", type=float, default=2600.0, help="median response length (paper Fig. 2)")
    ap.add_argument("--length-sigma", type=float, default=0.99, help="lognormal sigma (p99/p50 = 10)")
    ap.add_argument("--max-response-tokens", type=int, default=16384, help="response cap (paper: 16K)")
    ap.add_argument("--decode-tok-s", type=float, default=40.0,
                    help="per-sequence decode rate of a 7B model on an H100 under a full batch")
    ap.add_argument("--turns", type=int, default=4, help="turns per trajectory")
    ap.add_argument("--tool-s", type=float, default=0.5, help="median tool latency")
    ap.add_argument("--pcie-gb-s", type=float, default=25.0, help="host-to-GPU copy rate of a weight load")
    ap.add_argument("--step-s", type=float, default=30.0, help="modelled learner step time")
    ap.add_argument("--state-mb", type=float, default=None, help="the learner's state dict (default 256; --quick 8)")
    ap.add_argument("--speedup", type=float, default=None, help="divides every modelled delay (default 20; --quick 50)")
    ap.add_argument("--token-scale", type=int, default=100, help="modelled tokens per returned token")
    ap.add_argument("--fanout-gb", type=float, default=None, help="state dict size for the fan-out (default 3; --quick 0.0625)")
    ap.add_argument("--fanout-workers", default=None, help="comma-separated pull counts (default 1,8,64; --quick 1,8)")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # one size in a fresh process
    ap.add_argument("--fanout-one", type=int, default=None, help=argparse.SUPPRESS)  # one fan-out, likewise
    args = ap.parse_args(argv)
    q = args.quick
    args.sizes = [int(s) for s in (args.sizes or ("64" if q else "64,256,1024")).split(",")]
    args.steps = args.steps or (1 if q else 4)
    args.state_mb = args.state_mb if args.state_mb is not None else (8.0 if q else 256.0)
    args.speedup = args.speedup or (50.0 if q else 20.0)
    args.fanout_gb = args.fanout_gb if args.fanout_gb is not None else (0.0625 if q else 3.0)
    args.fanout_workers = [int(s) for s in (args.fanout_workers or ("8" if q else "1,8,64")).split(",")]
    if q:  # a few trajectories a worker and small batches: the point is the real loop's path, not the rate
        args.per_worker, args.group_size = min(args.per_worker, 4), min(args.group_size, 4)
        args.batch_share = min(args.batch_share, 1 / 16)
    share = args.batch_share
    args.batch_groups = lambda w: max(1, int(w * share * 16 / args.group_size))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.one is not None:  # a child: one size, its own process (peak RSS, a clean heap)
        print(json.dumps(asyncio.run(controller_run(args, args.one))), flush=True)
        return
    if args.fanout_one is not None:
        print(json.dumps(asyncio.run(fanout_in_process(int(args.fanout_gb * 1e9), args.fanout_one, args.ray > 0))),
              flush=True)
        return
    load0 = load_average()
    paper = paper_rate_1024(args.quick)
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    lines = []
    for workers in args.sizes:
        out = subprocess.run([sys.executable, __file__, *passthrough, "--one", str(workers)],
                             capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            sys.stderr.write(out.stderr[-4000:])
            raise SystemExit(f"the {workers}-worker run failed (exit {out.returncode})")
        lines.append(json.loads(out.stdout.strip().splitlines()[-1]))
    fan = fanout_suite(int(args.fanout_gb * 1e9), args.fanout_workers, ray=False)
    ray_fan = fanout_suite(int(args.fanout_gb * 1e9), [args.ray], ray=True) if args.ray else None
    widest = fan["runs"][-1]
    for rec in lines:
        capacity = rec["controller_capacity_trajectories_per_s"]
        rec["paper_1024_trajectories_per_s"] = round(paper, 2)
        rec["headroom_over_paper_1024"] = round(capacity / paper, 2) if capacity else None
        rec["relay_copies_per_node"] = widest["copies_per_node"]
        rec["relay_gb_per_s_over_memcpy"] = widest["gb_per_s_over_memcpy"]
        rec["relay_gb_per_s_over_fresh_memcpy"] = widest["gb_per_s_over_fresh_memcpy"]
        rec["relay_fanout"] = fan
        if ray_fan is not None:
            rec["relay_fanout_ray"] = ray_fan
        rec.update(commit=git_commit(), load_avg=[load0, load_average()], speedup=args.speedup,
                   quick=args.quick, cpus=os.cpu_count())
        emit(rec)


if __name__ == "__main__":
    main()
