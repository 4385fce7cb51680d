"""Laminar at cluster scale, by discrete-event simulation on a virtual clock (issue 10).

    python bench/laminar_sim.py --gpus 256 [--quick]

Four systems (plus a no-repack ablation of Laminar) share one simulated cluster and workload: `sync` (verl-like, colocated: generate,
train, update), `one-step-off` (rollout and trainer on separate GPUs, batch k+1 generated while
batch k trains, global weight sync), `global-async` (stream generation with partial rollouts:
replicas refill continuously, every update pauses all of them) and `laminar` (relays + repack).

The simulation drives agentrl's own code: the `ExperienceBuffer` (group writer, FIFO sampler,
staleness tags), the manager's `repack_inputs` + `best_fit_repack` (Algorithm 1) and the relay
latency model `optimal_broadcast_time` (algorithms.md §1.2). Only the engines are simulated:

- decode: every decoding sequence on a replica advances one token per step; a step costs
  `t_step` while the batch is memory-bound (b ≤ B, the roofline batch) and `t_step·b/B` above;
- trajectories: turns with lognormal token counts (σ=1.0 "agentrl", or σ=1.4 to mimic the skew
  the Laminar paper reports), a lognormal tool latency between turns;
- training: 6·params FLOPs per token at a fixed MFU on the trainer GPUs;
- weights: stop-the-world sync = NCCL broadcast + engine reload; Laminar: push copy (actor
  stall), chain broadcast T*(p) in the background, PCIe pull from the local relay.

Prints one JSON line. All figures are simulated seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.laminar.buffer import ExperienceBuffer
from agentrl.laminar.manager import repack_inputs
from agentrl.laminar.relay import optimal_broadcast_time
from agentrl.laminar.repack import best_fit_repack
from agentrl.laminar.worker import WorkerLoad
from agentrl.types import Segment, Status, Trajectory


@dataclass
class Params:
    gpus: int = 256
    tp: int = 2  # GPUs per rollout replica
    trainer_frac: float = 0.5  # disaggregated systems: share of GPUs that train
    prompts: int = 512  # global batch = prompts × G = 8192, as in the paper (strong scaling)
    G: int = 16
    concurrency: int = 256  # max trajectories per replica
    roofline_b: int = 128  # B: largest memory-bound decode batch
    t_step: float = 0.025  # s per decode step at b ≤ B (7B on one H800-class replica)
    prompt_tokens: int = 512
    turns_mean: float = 3.0
    turn_mu: float = math.log(400)
    turn_sigma: float = 1.0
    max_turn_tokens: int = 8192
    max_response_tokens: int = 16384  # the paper's maximum output: a trajectory truncates here
    tool_mu: float = math.log(1.5)
    tool_sigma: float = 0.8
    params_b: float = 7.0  # model size, billions
    gpu_flops: float = 989e12 * 0.4  # bf16 peak × MFU
    kv_tokens: int = 256 * 8192  # KV capacity per replica, tokens
    bytes_per_param: int = 2
    nic_bps: float = 50e9  # relay-to-relay (400 Gb/s)
    pcie_bps: float = 25e9
    memcpy_bps: float = 20e9  # trainer GPU → master relay host memory
    hop_start_s: float = 1e-4  # T_start of one chunk hop
    sync_fixed_s: float = 4.0  # stop-the-world: pause, reshard, engine cache reset
    repack_interval_s: float = 5.0
    repack_overhead_s: float = 0.69  # measured in the paper: a repack round's fixed cost
    prefill_tps: float = 20000.0  # tokens/s one replica re-prefills (KV rebuilt after a move or a
    # weight swap under partial rollout: the old KV was computed by the old weights)
    idle_rule: str = "fall"  # manager.repack_inputs: "fall" (default) or "prev" (pseudocode)
    iterations: int = 8
    warmup: int = 3
    seed: int = 0

    @property
    def model_bytes(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_param


# ---------------------------------------------------------------------------------------------
# the virtual clock and the simulated engines
# ---------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def run(self, stop: Callable[[], bool]) -> None:
        while self._heap and not stop():
            self.now, _, fn, args = heapq.heappop(self._heap)
            fn(*args)


@dataclass(eq=False)
class SimTraj:
    id: str
    group: str
    turns: list[int]
    tools: list[float]
    prompt: int
    version: int = 0
    turn: int = 0
    ctx: int = 0  # tokens in context (KV footprint)
    target: float = 0.0  # replica progress at which the current turn ends
    replica: Replica | None = None
    decoding: bool = False
    left: int | None = None  # tokens left in the current turn after a move
    tool_until: float = 0.0  # end of the tool call it waits on

    @property
    def tokens(self) -> int:
        return self.prompt + sum(self.turns)


class Replica:
    """Fluid decode model: all decoding sequences advance together, one token per step."""

    def __init__(self, rid: str, sim: System) -> None:
        self.id, self.sim = rid, sim
        self.version = 0
        self.trajs: set[SimTraj] = set()
        self.heap: list[tuple[float, int, SimTraj]] = []  # decoding, by target progress
        self.progress = 0.0
        self.last = 0.0
        self.epoch = 0
        self.paused = False
        self.peak = 0.0
        self.c_last = 0.0
        self.busy_s = 0.0  # time with ≥ 1 decoding sequence
        self.util_s = 0.0  # ∫ min(b, B)/B dt

    def _n_decoding(self) -> int:
        return sum(1 for t in self.trajs if t.decoding)

    def step_time(self, b: int) -> float:
        p = self.sim.p
        return p.t_step * max(1.0, b / p.roofline_b)

    def advance(self) -> None:
        now = self.sim.clock.now
        b = self._n_decoding()
        if b and not self.paused:
            dt = now - self.last
            self.progress += dt / self.step_time(b)
            self.busy_s += dt
            self.util_s += dt * min(b, self.sim.p.roofline_b) / self.sim.p.roofline_b
        self.last = now

    def schedule(self) -> None:
        self.epoch += 1
        while self.heap and not self.heap[0][2].decoding:
            heapq.heappop(self.heap)
        if self.paused or not self.heap:
            return
        b = self._n_decoding()
        t = self.sim.clock.now + max(0.0, self.heap[0][0] - self.progress) * self.step_time(b)
        self.sim.clock.at(t, self._on_decode, self.epoch)

    def _on_decode(self, epoch: int) -> None:
        if epoch != self.epoch:
            return
        self.advance()
        while self.heap and self.heap[0][0] <= self.progress + 1e-9:
            _, _, t = heapq.heappop(self.heap)
            if t.decoding and t.replica is self:
                t.decoding = False
                t.ctx += t.turns[t.turn]
                t.turn += 1
                if t.turn < len(t.turns):
                    t.tool_until = self.sim.clock.now + t.tools[t.turn - 1]
                    self.sim.clock.at(t.tool_until, self._tool_done, t)
                else:
                    self.trajs.discard(t)
                    t.replica = None
                    self.sim.finished(t, self)
        self.schedule()

    def _tool_done(self, t: SimTraj) -> None:
        if t.replica is self:
            self.decode(t)

    def decode(self, t: SimTraj, delay: float = 0.0) -> None:
        """Start (or continue) the current turn of `t` here."""
        if delay:
            self.sim.clock.at(self.sim.clock.now + delay, self._tool_done, t)
            return
        self.advance()
        t.decoding = True
        t.target = self.progress + (t.left if t.left is not None else t.turns[t.turn])
        t.left = None
        heapq.heappush(self.heap, (t.target, id(t), t))
        self.schedule()

    def add(self, t: SimTraj, delay: float = 0.0) -> None:
        t.replica = self
        self.trajs.add(t)
        self.decode(t, max(delay, t.tool_until - self.sim.clock.now))

    def take_all(self) -> list[SimTraj]:
        """Repack source: hand over every trajectory (current turn restarts on the destination)."""
        self.advance()
        out = list(self.trajs)
        for t in out:
            if t.decoding:  # keeps what it generated of this turn
                t.left = max(1, math.ceil(t.target - self.progress))
            t.decoding = False
            t.replica = None
        self.trajs.clear()
        self.schedule()
        return out

    def pause(self, seconds: float, then: Callable[[], None] | None = None) -> None:
        self.advance()
        self.paused = True
        self.epoch += 1

        def resume() -> None:
            self.paused = False
            self.last = self.sim.clock.now
            # partial rollout: a sequence mid-turn keeps its progress on the new weights
            self.schedule()
            if then is not None:
                then()

        self.sim.clock.at(self.sim.clock.now + seconds, resume)

    def load(self) -> WorkerLoad:
        self.advance()
        tokens = sum(t.ctx + (t.turns[t.turn] - max(0.0, t.target - self.progress) if t.decoding else 0)
                     for t in self.trajs)
        c = tokens / self.sim.p.kv_tokens
        self.peak = max(self.peak, c)
        prev, self.c_last = self.c_last, c
        return WorkerLoad(self.id, self.version, len(self.trajs), tokens, c, self.peak, False, False,
                          self.sim.clock.now, prev)


# ---------------------------------------------------------------------------------------------
# the four systems
# ---------------------------------------------------------------------------------------------


def run(coro: Any) -> Any:
    """Drive a coroutine of agentrl's asyncio code that must not block (the clock is virtual)."""
    try:
        coro.send(None)
    except StopIteration as e:
        return e.value
    raise RuntimeError("simulated call blocked")


class System:
    def __init__(self, name: str, p: Params) -> None:
        self.name, self.p = name, p
        self.clock = Clock()
        self.rng = random.Random(p.seed)  # same seed: every system sees the same workload
        self.groups = itertools.count()
        disagg = name != "sync"
        self.rollout_gpus = p.gpus - (int(p.gpus * p.trainer_frac) if disagg else 0)
        self.trainer_gpus = int(p.gpus * p.trainer_frac) if disagg else p.gpus
        self.replicas = [Replica(f"r{i}", self) for i in range(max(1, self.rollout_gpus // p.tp))]
        self.version = 0
        self.buffer = ExperienceBuffer(p.G, capacity=10**6)
        self.iter_end: list[float] = []
        self.iter_tokens: list[int] = []
        self.staleness: list[int] = []
        self.repack_moves = 0
        self.trainer_busy = False

    # -- workload ------------------------------------------------------------------------------

    def new_group(self, version: int) -> list[SimTraj]:
        p, rng = self.p, self.rng
        gid = f"g{next(self.groups)}"
        out = []
        for i in range(p.G):
            n = 1 + min(int(rng.expovariate(1 / max(p.turns_mean - 1, 1e-9))), 15)
            turns, total = [], 0
            for _ in range(n):  # truncated at the response budget, like a real rollout
                k = min(p.max_turn_tokens, max(8, int(rng.lognormvariate(p.turn_mu, p.turn_sigma))),
                        p.max_response_tokens - total)
                if k <= 0:
                    break
                turns.append(k)
                total += k
            n = len(turns)
            tools = [rng.lognormvariate(p.tool_mu, p.tool_sigma) for _ in range(n - 1)]
            out.append(SimTraj(f"{gid}/{i}", gid, turns, tools, p.prompt_tokens, version, ctx=p.prompt_tokens))
        return out

    @property
    def groups_per_replica(self) -> int:
        """Every system keeps the same work per replica: one global batch spread evenly (so no
        system wins by generating far ahead of what the trainer consumes)."""
        return max(1, min(self.p.concurrency // self.p.G, math.ceil(self.p.prompts / len(self.replicas))))

    def train_time(self, tokens: int) -> float:
        return 6 * self.p.params_b * 1e9 * tokens / (self.p.gpu_flops * self.trainer_gpus)

    def sync_cost(self) -> float:
        """Stop-the-world update: broadcast from the trainer to every engine, then reload."""
        return self.p.model_bytes / self.p.nic_bps * 2 + self.p.sync_fixed_s

    # -- experience ----------------------------------------------------------------------------

    def finished(self, t: SimTraj, r: Replica) -> None:
        seg = Segment(token_ids=[0], loss_mask=[1], logprobs=[0.0], versions=[t.version])
        traj = Trajectory(id=t.id, group_id=t.group, task_id=t.group, segments=[seg], status=Status.FINISHED,
                          metrics={"tokens": float(t.tokens)})
        run(self.buffer.write(traj))
        self.on_finished(r)

    def on_finished(self, r: Replica) -> None:
        self.maybe_train()

    def maybe_train(self) -> None:
        if self.trainer_busy or run(self.buffer.ready()) < self.p.prompts:
            return
        groups = run(self.buffer.sample(self.p.prompts))
        trajs = [t for g in groups for t in g.trajectories]
        self.staleness += [t.consumed_version - t.version for t in trajs]
        tokens = int(sum(t.metrics["tokens"] for t in trajs))
        self.trainer_busy = True
        self.clock.at(self.clock.now + self.train_time(tokens), self.trained, tokens)

    def trained(self, tokens: int) -> None:
        self.trainer_busy = False
        self.iter_tokens.append(tokens)
        self.update_weights()

    def update_weights(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def finish_iteration(self) -> None:
        self.version += 1
        run(self.buffer.set_version(self.version))
        self.iter_end.append(self.clock.now)

    # -- results -------------------------------------------------------------------------------

    def simulate(self) -> dict[str, Any]:
        self.start()
        self.clock.run(lambda: len(self.iter_end) >= self.p.iterations)
        w = min(self.p.warmup, len(self.iter_end) - 2)
        span = self.iter_end[-1] - self.iter_end[w]
        tokens = sum(self.iter_tokens[w + 1:len(self.iter_end)])
        trajs = (len(self.iter_end) - 1 - w) * self.p.prompts * self.p.G
        now = self.clock.now
        for r in self.replicas:
            r.advance()
        busy = sum(r.busy_s for r in self.replicas) / (now * len(self.replicas))
        util = sum(r.util_s for r in self.replicas) / (now * len(self.replicas))
        st = sorted(self.staleness) or [0]
        return {"tokens_per_s": tokens / span, "trajs_per_s": trajs / span,
                "iteration_s": span / (len(self.iter_end) - 1 - w),
                "rollout_idle_frac": round(1 - busy, 4), "rollout_decode_util": round(util, 4),
                "staleness_p50": st[len(st) // 2], "staleness_p99": st[int(len(st) * 0.99) - 1 if len(st) > 1 else 0],
                "staleness_max": st[-1], "repack_moves": self.repack_moves,
                "repack_moved_trajs": len(getattr(self, "moved_ids", ())),
                "replicas": len(self.replicas), "trainer_gpus": self.trainer_gpus}


class Batched(System):
    """sync and one-step-off: batches spread over all replicas; a global update between them.

    sync starts batch k once version k is loaded; one-step-off once version k−1 is (batch k
    generates while batch k−1 trains)."""

    def __init__(self, name: str, p: Params) -> None:
        super().__init__(name, p)
        self.in_flight = 0
        self.started = 0  # batches started

    def start(self) -> None:
        self.try_generate()

    def try_generate(self) -> None:
        lag = 1 if self.name == "one-step-off" else 0
        if self.in_flight or self.started - self.version > lag:
            return
        self.started += 1
        self.in_flight = self.p.prompts * self.p.G
        for i in range(self.p.prompts):  # round-robin; a group stays on one replica
            r = self.replicas[i % len(self.replicas)]
            for t in self.new_group(self.version):
                r.add(t)

    def on_finished(self, r: Replica) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.try_generate()
            self.maybe_train()

    def update_weights(self) -> None:
        cost = self.sync_cost()
        self.trainer_busy = True  # the trainer drives the global broadcast

        def done() -> None:
            self.trainer_busy = False
            self.finish_iteration()
            self.try_generate()
            self.maybe_train()

        for r in self.replicas:
            r.pause(cost)
        self.clock.at(self.clock.now + cost, done)


class GlobalAsync(System):
    """Stream generation, partial rollouts, a global pause for every update (AReaL-like)."""

    def start(self) -> None:
        for r in self.replicas:
            self.refill(r)

    def refill(self, r: Replica) -> None:
        while len(r.trajs) + self.p.G <= self.groups_per_replica * self.p.G:
            for t in self.new_group(self.version):
                r.add(t)

    def on_finished(self, r: Replica) -> None:
        if not r.paused:
            self.refill(r)
        self.maybe_train()

    def update_weights(self) -> None:
        cost = self.sync_cost()
        self.trainer_busy = True

        def done() -> None:
            self.trainer_busy = False
            self.finish_iteration()
            self.maybe_train()

        for r in self.replicas:  # partial rollout: every in-flight context is re-prefilled
            ctx = sum(t.ctx for t in r.trajs)
            r.pause(cost + ctx / self.p.prefill_tps, then=lambda r=r: self.refill(r))
        self.clock.at(self.clock.now + cost, done)


class Laminar(System):
    """Relays + per-replica weight pulls + Best-Fit repack (algorithms.md §1)."""

    def __init__(self, name: str, p: Params) -> None:
        super().__init__(name, p)
        self.relay_version: list[tuple[float, int]] = [(0.0, 0)]  # (arrival at the relays, version)
        self.pulling: set[Replica] = set()
        self.moved_ids: set[str] = set()

    def start(self) -> None:
        for r in self.replicas:
            self.take_batch(r)
        self.clock.at(self.p.repack_interval_s, self.periodic_repack)

    def latest_at_relay(self) -> int:
        return max(v for t, v in self.relay_version if t <= self.clock.now)

    def take_batch(self, r: Replica) -> None:
        r.peak = 0.0
        for _ in range(self.groups_per_replica):
            for t in self.new_group(r.version):
                r.add(t)

    def on_empty(self, r: Replica) -> None:
        """Pull the newest weights from the colocated relay over PCIe, then a fresh batch."""
        if r.trajs or r in self.pulling:
            return
        v = self.latest_at_relay()
        if v == r.version:
            self.take_batch(r)
            return
        self.pulling.add(r)

        def loaded() -> None:
            self.pulling.discard(r)
            r.version = v
            self.take_batch(r)

        self.clock.at(self.clock.now + self.p.model_bytes / self.p.pcie_bps, loaded)

    def on_finished(self, r: Replica) -> None:
        if not r.trajs:
            self.on_empty(r)
        self.maybe_train()

    def update_weights(self) -> None:
        p = self.p
        stall = p.model_bytes / p.memcpy_bps  # the trainer's only wait: copy to the master relay
        relays = max(2, p.gpus // 8)  # one relay per 8-GPU machine
        broadcast = optimal_broadcast_time(relays, p.model_bytes, 1 / p.nic_bps, p.hop_start_s)

        def pushed() -> None:
            self.finish_iteration()
            self.relay_version.append((self.clock.now + broadcast, self.version))
            self.clock.at(self.clock.now + broadcast, self.wake_idle)
            self.repack()
            self.maybe_train()

        self.clock.at(self.clock.now + stall, pushed)

    def wake_idle(self) -> None:
        for r in self.replicas:
            if not r.trajs:
                self.on_empty(r)

    def periodic_repack(self) -> None:
        self.repack()
        self.clock.at(self.clock.now + self.p.repack_interval_s, self.periodic_repack)

    def repack(self) -> None:
        """The manager's own code: loads grouped by version → Algorithm 1 → move whole replicas."""
        if self.name == "laminar-no-repack":  # ablation: relays and per-replica pulls only
            return
        by_id = {r.id: r for r in self.replicas}
        loads = [r.load() for r in self.replicas if r not in self.pulling]
        for _version, group in repack_inputs(loads, self.p.idle_rule).items():
            for src, dst in best_fit_repack(group, 0.99, self.p.roofline_b):
                s, d = by_id[src], by_id[dst]
                moved = s.take_all()
                prefill = sum(t.ctx for t in moved) / self.p.prefill_tps  # KV rebuilt on d
                for t in moved:
                    d.add(t, delay=self.p.repack_overhead_s + prefill)
                self.repack_moves += len(moved)
                self.moved_ids.update(t.id for t in moved)
                self.on_empty(s)


SYSTEMS: dict[str, type[System]] = {"sync": Batched, "one-step-off": Batched, "global-async": GlobalAsync,
                                    "laminar": Laminar, "laminar-no-repack": Laminar}


def simulate(p: Params) -> dict[str, Any]:
    out: dict[str, Any] = {"gpus": p.gpus, "global_batch": p.prompts * p.G, "turn_sigma": p.turn_sigma,
                           "systems": {}}
    for name, cls in SYSTEMS.items():
        out["systems"][name] = cls(name, p).simulate()
    s = out["systems"]
    out["laminar_over_sync"] = round(s["laminar"]["tokens_per_s"] / s["sync"]["tokens_per_s"], 3)
    out["laminar_over_one_step_off"] = round(s["laminar"]["tokens_per_s"] / s["one-step-off"]["tokens_per_s"], 3)
    out["laminar_over_global_async"] = round(s["laminar"]["tokens_per_s"] / s["global-async"]["tokens_per_s"], 3)
    out["repack_gain"] = round(s["laminar"]["tokens_per_s"] / s["laminar-no-repack"]["tokens_per_s"], 3)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=256, help="GPUs in the cluster (64..1024)")
    ap.add_argument("--quick", action="store_true", help="a smaller batch and fewer iterations")
    ap.add_argument("--skew", choices=["agentrl", "paper"], default="paper",
                    help="trajectory-length skew: lognormal σ=1.0 (agentrl) or σ=1.4 (paper-like)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--idle-rule", choices=["fall", "prev"], default="fall",
                    help="repack candidates: from the start of the fall (default) or C_used < C_prev")
    args = ap.parse_args(argv)
    if args.gpus < 4:
        ap.error("--gpus must be >= 4")
    p = Params(gpus=args.gpus, seed=args.seed, turn_sigma=1.4 if args.skew == "paper" else 1.0,
               idle_rule=args.idle_rule)
    if args.quick:
        p.prompts, p.iterations, p.warmup = 128, 5, 1
    result = simulate(p)
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    asyncio.get_event_loop_policy()  # the buffer's asyncio primitives bind no loop until they wait
    main()
