"""Laminar at cluster scale: a discrete-event simulator calibrated against the paper (issue 19).

    python bench/laminar_sim.py --calibrate            # paper value, sim value, ratio; JSON line
    python bench/laminar_sim.py --gpus 256 --model 7B  # every system at one scale; JSON line
    python bench/laminar_sim.py --sweep --plots docs   # 64..1024 GPUs, PNGs + staleness histograms
    python bench/laminar_sim.py --beyond               # agentrl's choices vs the paper's
    python bench/laminar_sim.py --params               # every parameter with its source

What is real and what is simulated. The experience buffer (`ExperienceBuffer`: group writer,
FIFO sampler, staleness tags and histogram), the manager's `repack_inputs`, Algorithm 1
(`best_fit_repack`), the worker's `WorkerLoad` heartbeat and the relay's chain latency model
(`broadcast_time`, `best_chunk_count`, `optimal_broadcast_time`) are agentrl's own code, called
on a virtual clock. The engines, the trainer and the wires are models built only from the
figures in `PARAMS` (hardware datasheets, the paper's setup, Qwen2.5 configs), each with its
source:

- decode (vLLM, continuous batching): a replica of `tp` GPUs runs one step for all running
  sequences (up to verl's max_num_seqs 1024); GPU time = max(weights + KV bytes / HBM
  bandwidth, 2·P·b FLOPs / compute) + TP all-reduce latency. verl v0.5 runs vLLM eagerly
  (enforce_eager=True), so a step is the longer of the GPU time and the CPU's kernel launches
  (per layer), plus scheduling: a near-empty replica -- the long tail of a synchronous batch --
  is launch-bound and more TP GPUs barely help (paper Fig. 4); AReaL's SGLang replays CUDA
  graphs up to 160 running requests (its default cuda_graph_max_bs) and launches eagerly
  above. KV capacity = `tp`·80 GB·gpu_memory_utilization − weights, divided by the model's
  KV bytes per token. Admission is FCFS while the KV fits (vLLM's 1% watermark); when the KV
  fills, the newest sequence is preempted and later re-prefilled.
- prefill (new prompts, preempted or moved sequences, partial-rollout resumes): compute-bound;
  it stalls decoding except for the compute a memory-bound decode step leaves idle (chunked
  prefill, vLLM V1), so a re-prefill onto a lightly loaded repack destination is nearly free;
  AReaL's SGLang does not mix prefill into decode by default, so the re-prefill of every
  sequence after a partial-rollout interruption pauses decoding.
- training (verl's FSDP for every system but AReaL): 8·P FLOPs per token (forward, backward,
  recomputed forward) + 2·P for the old-log-prob pass; per micro-batch the ZeRO-3 parameter
  all-gathers (forward, backward) and the fp32 gradient reduce-scatter inside the FSDP group
  (NVLink within a machine, the NICs across machines), overlapped with compute -- a floor per
  optimizer step that does not shrink as GPUs are added. Every optimizer step waits for its
  most loaded data-parallel unit: verl's balance_batch evens each unit's share of the whole
  batch, not of each mini-batch, so under strong scaling (fewer sequences per unit and step)
  the skewed lengths stop averaging out. AReaL: Megatron TP×PP with a 1F1B bubble, the
  distributed optimizer's DP traffic and the same per-step straggler.
- Laminar's rollouts each pull their share of a global batch (512 trajectories per 32B replica
  at 128 GPUs, as in the paper's Fig. 9), but at least enough to fill their KV cache at the mean
  trajectory length (§5.2's ramp-up and plateau), capped at 1024; AReaL keeps 1024 in flight.
- weights: NCCL global sync = FSDP gather + a pipelined ring broadcast of each rollout shard
  (the App. D chain model in 4 MiB NCCL chunks) + the engine reload; Laminar = a push to the
  master relay (the actor's only stall), the App. D chain broadcast between relays, a PCIe
  load from the local relay; AReaL v0.3 = through storage (save, flush every server,
  update_weights_from_disk, where every TP rank of a server reads the whole checkpoint), costed
  with the paper's §4.1 storage profile. A pause grows with the model, not with the cluster, so
  it caps AReaL's update rate at scale (with the re-prefill that follows each update).

Every system runs on the paper's placements (Table 2) and workload (8192 trajectories = 512
prompts × 16, 16K-token output cap, response lengths lognormal with p99/p50 = 10, Fig. 2).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import os
import random
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentrl.laminar.buffer import ExperienceBuffer
from agentrl.laminar.manager import repack_inputs
from agentrl.laminar.relay import best_chunk_count, broadcast_time, optimal_broadcast_time
from agentrl.laminar.repack import best_fit_repack
from agentrl.laminar.worker import WorkerLoad
from agentrl.types import Segment, Status, Trajectory

GB = 1e9


def _p(default: Any, source: str) -> Any:
    return field(default=default, metadata={"source": source})


@dataclass(frozen=True)
class Params:
    """Every physical or published figure the simulator uses, with its source. Nothing else
    enters the model; no figure differs between systems except where the paper's setup does
    (placement, TP size, concurrency, staleness bound)."""

    # -- hardware: the paper's testbed (§8: 128 machines × 8 H800-80GB, NVLink, 8×400 Gb/s) --
    gpus_per_node: int = _p(8, "paper §8 testbed")
    gpu_mem: float = _p(80 * GB, "paper §8: H800-80GB")
    hbm_bps: float = _p(3.35e12, "H800 SXM datasheet: 3.35 TB/s HBM3")
    gpu_flops: float = _p(989e12, "H800 SXM datasheet: 989 TFLOPS dense BF16")
    nic_bps: float = _p(50 * GB, "paper §8: 8×400 Gb/s per machine = 50 GB/s per GPU")
    pcie_bps: float = _p(64 * GB, "PCIe Gen5 x16 (H800 host link), 64 GB/s per direction")
    relay_bps: float = _p(100 * GB, "fitted: host-memory RDMA rate of one relay process (= 2 of the machine's "
                          "8×400 Gb/s NICs), from the paper's 32B actor stall 0.64 s; it then predicts the "
                          "72B stall and the 72B chain broadcast")
    rdma_start_s: float = _p(5e-6, "paper App. D: T_start of an RDMA message ~5 µs")
    nccl_chunk_bytes: int = _p(4 * 1024 * 1024, "NCCL default NCCL_BUFFSIZE 4 MiB (ring pipeline chunk)")
    nvlink_bps: float = _p(400 * GB, "paper §8: 400 GB/s NVLink inside a machine")
    nccl_start_s: float = _p(20e-6, "assumption: NCCL per-chunk ring step latency ~20 µs")
    # -- efficiency of the engines (engineering figures, the same for every system) --
    hbm_util: float = _p(0.80, "assumption: achievable fraction of HBM bandwidth reading weights (GEMV)")
    attn_util: float = _p(0.80, "assumption: achievable fraction of HBM bandwidth in paged attention over long "
                          "contexts (KV reads), the same as the weight GEMV's `hbm_util`. Chosen with paper §2.4/§5.2 "
                          "in view: Fig. 4's one-step decode latency of Qwen2.5-7B/32B on H800 'remains stable' as the "
                          "batch grows to the KV-cache limit; with the 0.50 assumed before, a KV-full 7B TP-1 step was "
                          "1.8x a near-empty (launch-bound) one, with 0.80 it is 1.3x (the KV bytes alone need 17 ms "
                          "at the HBM peak, so it cannot be flat)")
    mfu_decode: float = _p(0.50, "assumption: decode GEMM efficiency at large batch")
    mfu_prefill: float = _p(0.50, "assumption: prefill MFU (vLLM chunked prefill)")
    mfu_train: float = _p(0.40, "assumption: bf16 training MFU of the compute itself (FSDP or Megatron); "
                          "communication and pipeline bubbles are modelled separately")
    train_flops: float = _p(8.0, "FLOPs per parameter per trained token: 2 forward + 4 backward + 2 for the "
                            "recomputed forward (verl's DAPO recipes set enable_gradient_checkpointing; "
                            "16K-token rows need it)")
    logprob_flops: float = _p(2.0, "FLOPs per parameter per token of the old-log-prob forward over the batch "
                              "(verl compute_log_prob; AReaL recomputes proximal log-probs)")
    micro_tokens: int = _p(18432, "verl DAPO recipe: ppo_max_token_len_per_gpu = max prompt + max response "
                           "(2K + 16K) tokens per micro-batch and sequence-parallel rank")
    grad_reduce_bytes: int = _p(4, "verl FSDP mixed precision: reduce_dtype fp32 (gradient reduce-scatter)")
    step_overhead_s: float = _p(3e-3, "assumption: vLLM per-step scheduling + sampling CPU time")
    eager_layer_s: float = _p(0.73e-3, "fitted: CPU time to launch one decoder layer's kernels in eager PyTorch, "
                              "from Table 1's maximum trajectory latency (826 s: Laminar 32B on 128 GPUs without "
                              "repack, 512 trajectories per TP-4 rollout, a 16K-token tail; 0.73 ms gives 821 s, the "
                              "previous assumed 0.3 ms gave 563 s) -- about 50 us per launch of a layer's ~15 kernels. "
                              "verl v0.5 runs vLLM with enforce_eager=True (CUDA graphs became its default only after "
                              "v0.5, verl PR #2956), so every system built on verl pays it per decode step -- the "
                              "reason the paper's Fig. 4 finds more TP GPUs per rollout barely cut decode latency; "
                              "AReaL's SGLang replays CUDA graphs up to `sglang_graph_max_bs` running requests")
    allreduce_latency_s: float = _p(8e-6, "assumption: NVLink all-reduce latency per call (2 per layer)")
    engine_reload_s: float = _p(3.1, "fitted: vLLM/SGLang weight reload + cache reset per sync or pull (the same "
                                "for every system), from Fig. 14's best-case rollout-wait reduction vs NCCL "
                                "global sync, 47% (the 64-1024-GPU range there is the 72B grid)")
    storage_shard_bytes: float = _p(4 * GB, "paper §4.1: profiled shard size (4 GB of a 32B model)")
    storage_serialize_s: float = _p(8.0, "paper §4.1: serializing one 4 GB shard takes ~8 s")
    storage_transfer_s: float = _p(15.0, "paper §4.1: TCP transfer of it to/from the storage system adds 10-20 s "
                                   "(midpoint); AReaL v0.3 syncs weights this way (realhf GserverManager: "
                                   "update_weights_from_disk)")
    sglang_rank_reads_checkpoint: bool = _p(True, "SGLang's update_weights_from_disk runs the model loader on every TP rank, "
                                            "and the loader iterates over every checkpoint file (realhf's HF save writes "
                                            "pytorch_model-*.bin shards, each torch.load-ed whole) before narrowing to the "
                                            "rank's slice: each rank of a TP-4 (32B) or TP-8 (72B) server reads the whole "
                                            "model from storage, not 1/TP of it, at the §4.1 rate (paper §4.1 also names "
                                            "the contention of many rollouts pulling from storage at once)")
    gserver_poll_s: float = _p(5.0, "realhf GserverManager._poll (AReaL v0.3): looks for a new version, updates every "
                               "server with it synchronously (pause_generation, update_weights_from_disk, "
                               "continue_generation, all servers gathered), then time.sleep(5): a version saved during a "
                               "reload waits for that reload to finish and the next poll")
    sglang_mixed_chunk: bool = _p(False, "SGLang ServerArgs default enable_mixed_chunk=False: a prefill batch pauses "
                                  "decoding (AReaL's rollouts, incl. the re-prefill after every partial-rollout "
                                  "interruption); vLLM V1 (0.9, every other system) mixes chunked prefill into "
                                  "decode steps, so prefill there uses the compute a memory-bound step leaves idle")
    sglang_graph_max_bs: int = _p(160, "SGLang 0.4 default largest captured CUDA-graph batch, 160 (GPUs with >= 25 "
                                  "GB); AReaL v0.3's SGLangConfig leaves cuda_graph_max_bs=None (the default) and "
                                  "disable_cuda_graph=False: its servers replay graphs up to 160 running requests and "
                                  "launch every kernel eagerly above (its rollouts hold up to 1024)")
    rpc_s: float = _p(0.36, "fitted: the fixed part of one repack move (export, RPCs, import, release) that the "
                      "destination loses besides its re-prefill, from §8.4's measured 0.69 s per move (the model's "
                      "re-prefill stall averages ~0.33 s there); was an assumed 0.01 s")
    # -- agentrl's own controller, measured (bench/controller.py: the real components, modelled GPUs) --
    controller_cpu_s_per_traj: float = _p(0.00074, "measured: bench/controller.py's controller CPU (relay, "
                                          "manager, buffer, pools, loop) per trajectory at 1,024 workers, 0.37 ms, "
                                          "plus Python's garbage collector in that process, 0.37 ms")
    repack_decision_s: float = _p(0.004, "measured: bench/controller.py's repack decision p99 (4.0 ms at "
                                  "1,024 workers), paid by every move of the round before it starts")
    kv_watermark: float = _p(0.01, "vLLM block-manager watermark default 0.01")
    gpu_mem_util_disagg: float = _p(0.90, "vLLM default gpu_memory_utilization")
    gpu_mem_util_colocated: float = _p(0.50, "verl default rollout.gpu_memory_utilization (colocated)")
    # -- workload (paper §8, App. A) --
    prompts: int = _p(512, "paper §8: 512 prompts × 16 = global batch 8192")
    group: int = _p(16, "paper §8: 16 responses per prompt")
    minibatches: int = _p(16, "paper §8: 16 mini-batch updates per iteration (throughput runs)")
    prompt_tokens: int = _p(300, "assumption: a DAPO-Math-17k prompt with its template (~300 tokens, max 2K)")
    max_response: int = _p(16384, "paper §8: maximum output 16K")
    len_sigma: float = _p(0.99, "paper Fig. 2: p99 length = 10× median -> σ = ln10 / 2.326")
    len_median: float = _p(2600.0, "fitted: median response length that reproduces Table 1's avg/max "
                           "trajectory latency ratio 290/828 (Fig. 17 is not in the parsed text)")
    max_num_seqs: int = _p(1024, "verl rollout config default max_num_seqs 1024 (every system but AReaL runs "
                           "vLLM through verl); paper App. A.2: 1024 trajectories per replica")
    concurrency: int = _p(1024, "paper App. A.2: max 1024 trajectories per replica (AReaL, Laminar)")
    c_max: float = _p(0.99, "paper §5.2: C_max above 99% of the KV cache")
    rollout_batch_share: bool = _p(True, "inferred (the paper gives only the cap, App. A.2): a Laminar rollout pulls "
                                   "its share of a global batch, ceil(512 prompts / replicas) groups, at most "
                                   "`concurrency` trajectories. With 1024 per replica, 64 replicas (7B/256) would "
                                   "hold 8 global batches in flight and by Little's law a trajectory would wait ~8 "
                                   "iterations on average, against Fig. 10's staleness 'typically under 3'")
    rollout_batch_fill_kv: bool = _p(True, "inferred from §5.2's KV life cycle (every rollout batch ramps up to C_max, "
                                     "plateaus while waiting requests refill freed space, then falls): a Laminar rollout "
                                     "pulls at least enough groups to fill its KV cache at the workload's mean "
                                     "trajectory length, ceil(KV tokens / (prompt + mean response) / 16) groups, when its "
                                     "share of a global batch is smaller (7B on 128-256 GPUs, 32B on 512, 72B on 512-1024; "
                                     "never at Table 1's point, where the share, 512, already over-fills the KV)")
    repack_interval_s: float = _p(5.0, "paper §5.1: periodic check every 5 s")
    # -- the run --
    warmup: int = _p(3, "iterations before measuring (paper: 10 warm-up, then 5 measured)")
    iterations: int = _p(4, "measured iterations")
    seed: int = _p(0, "one workload seed for every system")

    @property
    def batch(self) -> int:
        return self.prompts * self.group


@dataclass(frozen=True)
class Model:
    """Qwen2.5 configs (config.json on the model cards): params, layers, KV heads × head dim."""

    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int = 128
    rollout_tp: int = 1  # paper App. A.2 for AReaL/Laminar (7B: 1, 32B: 4, 72B: 8)
    batched_tp: int = 2  # verl / one-step / stream (7B: 2, 32B: 4, 72B: 8)
    fsdp: int = 8  # paper App. A.2: FSDP size 8 / 16 / 32
    sp: int = 4  # paper App. A.2: Ulysses sequence parallel 4 / 8 / 8
    mega_tp: int = 2  # paper App. A.2: AReaL's Megatron TP 2 / 4 / 4
    mega_pp: int = 1  # paper App. A.2: AReaL's Megatron PP 1 / 2 / 4

    @property
    def weight_bytes(self) -> float:
        return 2 * self.params

    @property
    def kv_bytes(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


MODELS = {
    "7B": Model("7B", 7.6e9, 28, 4, rollout_tp=1, batched_tp=2, fsdp=8, sp=4, mega_tp=2, mega_pp=1),
    "32B": Model("32B", 32.8e9, 64, 8, rollout_tp=4, batched_tp=4, fsdp=16, sp=8, mega_tp=4, mega_pp=2),
    "72B": Model("72B", 72.7e9, 80, 8, rollout_tp=8, batched_tp=8, fsdp=32, sp=8, mega_tp=4, mega_pp=4),
}

# Paper Table 2: (total, train, rollout) GPUs per system and model; verl is colocated.
# Laminar 72B at 512 and 1024 GPUs: the parsed table reads train = rollout = 192 and 256, which
# leaves 128 and 512 of the row's total idle, unlike every other disaggregated row (train +
# rollout = total). We keep its rollout column and give the trainer the rest (320 and 768):
# §8.1 says Laminar's efficient generation "allows allocating more GPUs to the trainer ... as
# compared to other asynchronous baselines" (one-step 192/256, AReaL 320/640 there); the other
# reading (rollout = the rest: 320/768) would give Laminar's trainer no more than one-step's.
PLACEMENT: dict[str, dict[str, list[tuple[int, int, int]]]] = {
    "one-step": {"7B": [(16, 8, 8), (32, 8, 24), (64, 16, 48), (128, 32, 96), (256, 40, 216)],
                 "32B": [(32, 16, 16), (64, 32, 32), (128, 48, 80), (256, 64, 192), (512, 80, 432)],
                 "72B": [(64, 32, 32), (128, 64, 64), (256, 96, 160), (512, 192, 320), (1024, 256, 768)]},
    "areal": {"7B": [(16, 8, 8), (32, 16, 16), (64, 32, 32), (128, 64, 64), (256, 128, 128)],
              "32B": [(32, 16, 16), (64, 32, 32), (128, 64, 64), (256, 128, 128), (512, 256, 256)],
              "72B": [(64, 32, 32), (128, 64, 64), (256, 128, 128), (512, 320, 192), (1024, 640, 384)]},
    "laminar": {"7B": [(16, 8, 8), (32, 24, 8), (64, 40, 24), (128, 80, 48), (256, 192, 64)],
                "32B": [(32, 16, 16), (64, 32, 32), (128, 64, 64), (256, 128, 128), (512, 256, 256)],
                "72B": [(64, 32, 32), (128, 64, 64), (256, 128, 128), (512, 320, 192), (1024, 768, 256)]},
}
PLACEMENT["stream"] = PLACEMENT["one-step"]
PLACEMENT["laminar-no-repack"] = PLACEMENT["laminar"]


def placement(system: str, model: str, gpus: int) -> tuple[int, int]:
    """(train GPUs, rollout GPUs). Table 2 where the paper gives it; otherwise the nearest row
    scaled proportionally (whole machines where possible); colocated systems use all GPUs."""
    if system in ("verl", "april"):
        return gpus, gpus
    rows = PLACEMENT[system][model]
    for total, train, roll in rows:
        if total == gpus:
            return train, roll
    total, train, roll = min(rows, key=lambda r: abs(math.log(r[0] / gpus)))
    tp = MODELS[model].rollout_tp
    roll = max(tp, round(roll * gpus / total / tp) * tp)
    return gpus - roll, roll


def mean_response(p: Params) -> float:
    """Mean response length of the workload: a lognormal (median `len_median`, σ `len_sigma`)
    capped at `max_response`."""
    mu, s, c = math.log(p.len_median), p.len_sigma, p.max_response
    z = (math.log(c) - mu) / s
    phi = NormalDist().cdf
    return math.exp(mu + s * s / 2) * phi(z - s) + c * (1 - phi(z))


def step_loads(tokens: float, steps: int, units: int, lengths: list[float] | None = None) -> list[float]:
    """Tokens on the most loaded data-parallel unit in each optimizer step.

    verl's `balance_batch` (on by default) splits the batch into equal-count partitions with
    balanced token sums (Karmarkar-Karp; greedy longest-first here) and keeps each partition in
    its original order; each unit then cuts its share into `steps` consecutive mini-batches
    (`ppo_mini_batch_size` per rank), and every optimizer step waits for the unit whose
    mini-batch holds the most tokens. Without `lengths`: a perfectly even split."""
    steps = max(1, steps)
    if not lengths:
        return [tokens / steps / max(1, units)] * steps
    units = max(1, min(units, len(lengths)))
    cap = -(-len(lengths) // units)
    heap = [(0.0, u) for u in range(units)]
    parts: list[list[int]] = [[] for _ in range(units)]
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        total, u = heapq.heappop(heap)
        while len(parts[u]) >= cap:  # a full partition takes no more
            total, u = heapq.heappop(heap)
        parts[u].append(i)
        heapq.heappush(heap, (total + lengths[i], u))
    loads = [0.0] * steps
    for part in parts:
        part.sort()
        k = len(part)
        for s in range(steps):
            chunk = part[s * k // steps:(s + 1) * k // steps]
            loads[s] = max(loads[s], sum(lengths[i] for i in chunk))
    return loads


# ---------------------------------------------------------------------------------------------
# the virtual clock
# ---------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def run(self, stop: Callable[[], bool], horizon: float = 1e7) -> None:
        while self._heap and not stop():
            self.now, _, fn, args = heapq.heappop(self._heap)
            if self.now > horizon:
                raise RuntimeError(f"simulation passed {horizon:.0f} simulated seconds without finishing")
            fn(*args)


def drive(coro: Any) -> Any:
    """Run one of agentrl's coroutines that must not block (the clock is virtual)."""
    try:
        coro.send(None)
    except StopIteration as e:
        return e.value
    coro.close()
    raise RuntimeError("simulated call blocked")


def seq_tokens(trajs: list[Trajectory]) -> list[float]:
    """Prompt + response tokens of each sampled trajectory (what the trainer processes)."""
    return [t.metrics["tokens"] for t in trajs]


# ---------------------------------------------------------------------------------------------
# trajectories and the engine
# ---------------------------------------------------------------------------------------------


class Seq:
    """One trajectory: prompt + `length` response tokens, generated `done` so far."""

    __slots__ = ("adm", "ctx0", "done", "group", "id", "length", "p0", "start", "version", "versions")

    def __init__(self, sid: str, group: str, length: int, version: int, start: float) -> None:
        self.id, self.group, self.length, self.version, self.start = sid, group, length, version, start
        self.done = 0  # response tokens generated before the current admission
        self.p0 = 0.0  # replica progress at admission
        self.ctx0 = 0  # context tokens at admission (prompt + done)
        self.adm = 0  # admissions so far: a heap entry of an earlier admission is stale
        self.versions: set[int] = {version}


class Replica:
    """A vLLM-like engine: FCFS admission while the KV fits, one decode step for all running
    sequences, preemption of the newest when the KV fills (fluid: all running sequences
    advance one token per step; events at finishes and at KV-full)."""

    def __init__(self, rid: str, sim: System, tp: int, mem_util: float) -> None:
        p, m = sim.p, sim.model
        self.id, self.sim, self.tp = rid, sim, tp
        self.cap = (tp * p.gpu_mem * mem_util - m.weight_bytes) / m.kv_bytes  # KV tokens
        if self.cap < p.prompt_tokens + p.max_response:
            raise ValueError(f"{m.name} with TP={tp} leaves no room for one 16K sequence in KV")
        self.version = 0
        self.running: dict[Seq, None] = {}  # admission order
        self.waiting: deque[Seq] = deque()
        self.heap: list[tuple[float, int, int, Seq]] = []  # (finish progress, tiebreak, admission, seq)
        self.s_base = 0.0  # Σ(ctx0 − p0) over running: KV = s_base + n·progress
        self.progress = 0.0
        self.last = 0.0
        self.stall_until = 0.0  # prefill or weight load in progress: no decode
        self.epoch = 0
        self.busy = False  # pulling weights / paused by a global sync
        self.c_peak = 0.0
        self.c_last = 0.0
        self.kv_integral = 0.0  # ∫ KV/cap dt
        self.tokens_out = 0.0  # response tokens decoded (throughput)
        self.prefill_tokens = 0.0
        t_w = m.weight_bytes / (tp * p.hbm_bps * p.hbm_util)
        self._fixed = t_w + (2 * m.layers * p.allreduce_latency_s if tp > 1 else 0.0)
        self._per_kv = m.kv_bytes / (tp * p.hbm_bps * p.attn_util)
        self._per_seq = 2 * m.params / (tp * p.gpu_flops * p.mfu_decode)
        self._prefill = 2 * m.params / (tp * p.gpu_flops * p.mfu_prefill)
        self._overhead = p.step_overhead_s
        # eager mode: the CPU launches every layer's kernels each step; the GPU runs behind it,
        # so a step takes the longer of the two (CUDA graphs replay the step in one launch)
        self._launch = m.layers * p.eager_layer_s
        # CUDA graphs (AReaL's SGLang) replay a step only up to the largest captured batch;
        # a bigger batch runs eagerly. vLLM under verl v0.5 is eager at every batch size.
        self._graph_max = p.sglang_graph_max_bs if not sim.eager else -1

    # -- state ------------------------------------------------------------------------------

    @property
    def n(self) -> int:
        return len(self.running)

    @property
    def held(self) -> int:
        return len(self.running) + len(self.waiting)

    def kv(self) -> float:
        return self.s_base + self.n * self.progress

    def step_time(self) -> float:
        n = len(self.running)
        kv = self.s_base + n * self.progress
        launch = self._launch if n > self._graph_max else 0.0
        return self._overhead + max(launch, self._fixed + kv * self._per_kv, n * self._per_seq)

    def advance(self) -> None:
        now = self.sim.clock.now
        if now <= self.last:
            return
        start = max(self.last, self.stall_until)
        n = len(self.running)
        kv = self.s_base + n * self.progress
        if n and start < now and not self.busy:
            steps = (now - start) / self.step_time()
            self.progress += steps
            self.tokens_out += steps * n
        self.kv_integral += (now - self.last) * min(1.0, kv / self.cap)
        self.last = now

    def schedule(self) -> None:
        self.epoch += 1
        while self.heap and not self._live(self.heap[0]):
            heapq.heappop(self.heap)
        if not self.running or self.busy:
            return
        st = self.step_time()
        steps = self.heap[0][0] - self.progress
        n = len(self.running)
        room = self.cap - self.s_base - n * self.progress
        if room > 0:
            steps = min(steps, room / n + 1e-6)
        elif n > 1:
            steps = 0.0  # preempt now
        start = max(self.sim.clock.now, self.stall_until)
        self.sim.clock.at(start + max(0.0, steps) * st, self._on_event, self.epoch)

    def _on_event(self, epoch: int) -> None:
        if epoch != self.epoch:
            return
        self.advance()
        finished = []
        while self.heap and self.heap[0][0] <= self.progress + 1e-6:
            entry = heapq.heappop(self.heap)
            s = entry[3]
            if self._live(entry):
                self._remove(s)
                finished.append(s)
        if self.kv() >= self.cap:  # vLLM preempts the newest running sequence (recompute)
            target = self.cap * (1 - self.sim.p.kv_watermark)
            while self.n > 1 and self.kv() > target:
                s, _ = self.running.popitem()
                self._unrun(s)
                self.waiting.appendleft(s)
            self.sim.counters["preemptions"] += 1
        self.admit()
        self.schedule()
        for s in finished:
            self.sim.finished(s, self)
        if not self.held:
            self.sim.on_empty(self)

    # -- sequences --------------------------------------------------------------------------

    def _live(self, entry: tuple[float, int, int, Seq]) -> bool:
        return entry[3] in self.running and entry[3].adm == entry[2]

    def _ctx(self, s: Seq) -> int:
        return self.sim.p.prompt_tokens + s.done

    def _remove(self, s: Seq) -> None:
        del self.running[s]
        self.s_base -= s.ctx0 - s.p0
        s.done = s.length

    def _unrun(self, s: Seq) -> None:
        """Take a running sequence off the engine, keeping the tokens it generated."""
        self.s_base -= s.ctx0 - s.p0
        s.done += int(self.progress - s.p0)

    def admit(self) -> None:
        """FCFS while the KV (plus the watermark) has room; prefills block decoding."""
        limit = self.cap * (1 - self.sim.p.kv_watermark)
        kv = self.kv()
        prefill = 0.0
        conc = self.sim.p.max_num_seqs
        busy = len(self.running)
        mixed = self.sim.mixed_prefill()
        free = max(0.0, 1.0 - busy * self._per_seq / self.step_time()) if busy and mixed else 0.0
        while self.waiting and len(self.running) < conc:
            s = self.waiting[0]
            ctx = self._ctx(s)
            if kv + ctx > limit:
                break
            self.waiting.popleft()
            prefill += ctx  # new prompt, or the whole context of a preempted / moved sequence
            s.adm += 1
            s.p0, s.ctx0 = self.progress, ctx
            self.running[s] = None
            self.s_base += ctx - self.progress
            kv += ctx
            heapq.heappush(self.heap, (self.progress + (s.length - s.done), id(s), s.adm, s))
        if prefill:  # chunked prefill rides on the compute a memory-bound decode leaves idle
            self.stall(prefill * self._prefill * (1.0 - free))
            self.prefill_tokens += prefill
        self.c_peak = max(self.c_peak, kv / self.cap)

    def stall(self, seconds: float) -> None:
        self.advance()
        self.stall_until = max(self.stall_until, self.sim.clock.now) + seconds

    def add(self, seqs: Iterable[Seq], front: bool = False) -> None:
        self.advance()
        seqs = list(seqs)
        if front:
            self.waiting.extendleft(reversed(seqs))
        else:
            self.waiting.extend(seqs)
        self.admit()
        self.schedule()

    def take_all(self) -> list[Seq]:
        """Repack source / partial-rollout abort: every sequence leaves with its tokens."""
        self.advance()
        out = list(self.running)
        for s in out:
            self._unrun(s)
        self.running.clear()
        self.heap.clear()
        self.s_base = 0.0
        out += list(self.waiting)
        self.waiting.clear()
        self.schedule()
        return out

    def drop_kv(self) -> int:
        """New weights under partial rollout: every running sequence's KV is stale (AReaL)."""
        self.advance()
        seqs = list(self.running)
        for s in seqs:
            self._unrun(s)
        self.running.clear()
        self.heap.clear()
        self.s_base = 0.0
        self.waiting.extendleft(reversed(seqs))
        return sum(self._ctx(s) for s in seqs)

    def set_busy(self, busy: bool) -> None:
        self.advance()
        self.busy = busy
        if not busy:
            self.admit()
        self.schedule()

    def load(self) -> WorkerLoad:
        """The heartbeat agentrl's worker sends (KV use as c_used; peak since the batch)."""
        self.advance()
        c = min(1.0, self.kv() / self.cap)
        prev, self.c_last = self.c_last, c
        return WorkerLoad(self.id, self.version, self.held, int(self.kv()), c, self.c_peak, self.busy, False,
                          self.sim.clock.now, prev)


# ---------------------------------------------------------------------------------------------
# systems
# ---------------------------------------------------------------------------------------------


@dataclass
class Options:
    """agentrl's knobs (defaults: the paper's behaviour where it states one)."""

    idle_rule: str = "fall"  # manager.repack_inputs
    fetch_policy: str = "wait_inflight"  # relay.fetch_latest
    relay_chunk_bytes: int | None = None  # None: App. D optimum k*; else agentrl's fixed chunk size
    max_staleness: int | None = None  # buffer bound (None = the paper)
    repack: bool = True


class System:
    colocated = False
    eager = True  # vLLM under verl v0.5 (enforce_eager=True); AReaL's SGLang uses CUDA graphs
    name = "base"

    def __init__(self, p: Params, model: str, gpus: int, opts: Options | None = None) -> None:
        self.p, self.model, self.gpus = p, MODELS[model], gpus
        self.opts = opts or Options()
        self.clock = Clock()
        self.rng = random.Random(p.seed)
        self.gids = itertools.count()
        self.train_gpus, self.roll_gpus = placement(self.name, model, gpus)
        tp = self.tp()
        util = p.gpu_mem_util_colocated if self.colocated else p.gpu_mem_util_disagg
        self.replicas = [Replica(f"r{i}", self, tp, util) for i in range(max(1, self.roll_gpus // tp))]
        self.version = 0
        self.buffer = ExperienceBuffer(p.group, capacity=10**7, max_staleness=self.opts.max_staleness)
        self.iter_end: list[float] = []
        self.iter_tokens: list[int] = []
        self.latencies: list[float] = []
        self.counters: Counter[str] = Counter()
        self.consumed_staleness: Counter[int] = Counter()
        self.trainer_busy = False
        self.trainer_stall = 0.0
        self.waits: list[float] = []  # rollout waiting time per weight update

    def tp(self) -> int:
        return self.model.batched_tp

    def mixed_prefill(self) -> bool:
        """vLLM V1 mixes chunked prefill into decode steps (`sglang_mixed_chunk` for AReaL)."""
        return True

    # -- workload ---------------------------------------------------------------------------

    def new_group(self, version: int) -> list[Seq]:
        p, rng = self.p, self.rng
        gid = f"g{next(self.gids)}"
        now = self.clock.now
        out = []
        for i in range(p.group):
            n = int(rng.lognormvariate(math.log(p.len_median), p.len_sigma))
            out.append(Seq(f"{gid}/{i}", gid, max(16, min(p.max_response, n)), version, now))
        return out

    # -- training ---------------------------------------------------------------------------

    def dp_units(self) -> int:
        """Data-parallel units of the trainer: FSDP ranks grouped by Ulysses sequence parallelism."""
        return max(1, self.train_gpus // min(self.model.sp, self.train_gpus))

    def train_time(self, tokens: float, steps: int, lengths: list[float] | None = None) -> float:
        """verl's FSDP (ZeRO-3, HSDP) trainer on `train_gpus`: `steps` optimizer steps over `tokens`.

        Compute: `train_flops`·P per token (forward, backward, recomputed forward) plus the
        old-log-prob forward (`logprob_flops`·P). Each micro-batch (at most `micro_tokens` per
        sequence-parallel rank, at least one per step) all-gathers the bf16 parameters inside
        the FSDP group for the forward and again for the backward, and reduce-scatters the fp32
        gradients; the log-prob forward all-gathers once. FSDP prefetch overlaps this with
        compute, so a micro-batch takes the longer of the two. Inside one machine the group
        talks over NVLink, across machines over the NICs -- a cost per micro-batch that does
        not shrink as GPUs are added (strong scaling). Per step, the gradient shards are
        all-reduced across the data-parallel replicas of the FSDP group.

        With the batch's sequence lengths (`lengths`, prompt + response tokens), every optimizer
        step waits for its most loaded data-parallel unit (`step_loads`): under strong scaling
        each unit holds fewer sequences per mini-batch and the skewed lengths no longer average
        out."""
        p, m = self.p, self.model
        n = self.train_gpus
        f = min(m.fsdp, n)
        bw = p.nvlink_bps if f <= p.gpus_per_node else p.nic_bps
        gather = 2 * m.params * (f - 1) / f / bw
        reduce = p.grad_reduce_bytes * m.params * (f - 1) / f / bw
        sp = min(m.sp, n)
        units = self.dp_units()
        unit_rate = sp * p.gpu_flops * p.mfu_train  # one unit's GPUs share its sequences
        groups = n // f
        ddp = 2 * p.grad_reduce_bytes * m.params / f / p.nic_bps * (groups - 1) / groups if groups > 1 else 0.0
        total = 0.0
        for load in step_loads(tokens, steps, units, lengths):
            micro = max(1, math.ceil(load / (p.micro_tokens * sp)))
            fb = p.train_flops * m.params * load / unit_rate / micro
            lp = p.logprob_flops * m.params * load / unit_rate / micro
            total += micro * (max(fb, 2 * gather + reduce) + max(lp, gather)) + ddp
        return total

    # -- weights ----------------------------------------------------------------------------

    def nccl_sync_s(self) -> float:
        """GPU-direct global sync: each rollout shard goes down an NCCL ring (a pipelined
        chain, App. D model in 4 MiB chunks) to every replica, then the engine reloads."""
        p, m = self.p, self.model
        shard = m.weight_bytes / self.tp()
        k = max(1, int(shard // p.nccl_chunk_bytes))
        # the trainer first all-gathers each FSDP-sharded tensor (NVLink inside a machine, NICs across)
        gather_bps = p.nvlink_bps if m.fsdp <= p.gpus_per_node else p.nic_bps
        gather = m.weight_bytes * (m.fsdp - 1) / m.fsdp / gather_bps
        return gather + broadcast_time(len(self.replicas) + 1, k, shard, 1 / p.nic_bps, p.nccl_start_s) \
            + p.engine_reload_s

    # -- experience -------------------------------------------------------------------------

    def finished(self, s: Seq, r: Replica) -> None:
        self.latencies.append(self.clock.now - s.start)
        v = min(s.versions)  # the oldest policy that wrote a token (AReaL's staleness)
        seg = Segment(token_ids=[0], loss_mask=[1], logprobs=[0.0], versions=[v])
        traj = Trajectory(id=s.id, group_id=s.group, task_id=s.group, segments=[seg], status=Status.FINISHED,
                          metrics={"tokens": float(self.p.prompt_tokens + s.length)})
        drive(self.buffer.write(traj))
        self.on_finished(s, r)

    def on_finished(self, s: Seq, r: Replica) -> None:
        pass

    def on_empty(self, r: Replica) -> None:
        pass

    def sample(self, n_groups: int) -> tuple[int, list[Trajectory]]:
        groups = drive(self.buffer.sample(n_groups))
        trajs = [t for g in groups for t in g.trajectories]
        for g in groups:  # staleness the trainer sees: its version − the generating version
            self.consumed_staleness[self.version - (g.version or 0)] += len(g.trajectories)
        return int(sum(t.metrics["tokens"] for t in trajs)), trajs

    def publish(self, tokens: int) -> None:
        self.version += 1
        drive(self.buffer.set_version(self.version))
        self.iter_end.append(self.clock.now)
        self.iter_tokens.append(tokens)

    # -- results ----------------------------------------------------------------------------

    def done(self) -> bool:
        return len(self.iter_end) > self.p.warmup + self.p.iterations

    def simulate(self) -> dict[str, Any]:
        self.start()
        self.clock.run(self.done)
        w = self.p.warmup
        span = self.iter_end[-1] - self.iter_end[w]
        n = len(self.iter_end) - 1 - w
        tokens = sum(self.iter_tokens[w + 1:])
        now = self.clock.now
        for r in self.replicas:
            r.advance()
        t0 = self.iter_end[w]
        hist = drive(self.buffer.stats())["staleness_hist"]
        lat = sorted(self.latencies) or [0.0]
        gen = sum(r.tokens_out for r in self.replicas)
        return {"tokens_per_s": tokens / span, "iteration_s": span / n, "sim_s": now,
                "gen_tokens_per_s": gen / now, "kv_util": sum(r.kv_integral for r in self.replicas) / (now * len(self.replicas)),
                "latency_avg_s": sum(lat) / len(lat), "latency_max_s": lat[-1],
                "staleness_hist": hist, "staleness_max": max(hist) if hist else 0,
                "consumed_staleness_hist": dict(sorted(self.consumed_staleness.items())),
                "trainer_stall_s": self.trainer_stall / max(1, len(self.iter_end)),
                "rollout_wait_s": sum(self.waits) / len(self.waits) if self.waits else 0.0,
                "rollout_wait_min_s": min(self.waits) if self.waits else 0.0,
                "rollout_wait_max_s": max(self.waits) if self.waits else 0.0, "rollout_wait_count": len(self.waits),
                "train_gpus": self.train_gpus, "rollout_gpus": self.roll_gpus, "replicas": len(self.replicas),
                "evicted_groups": self.buffer.counts["groups_evicted_stale"],
                "measured_from_s": t0, **{k: v for k, v in self.counters.items()}}

    def start(self) -> None:
        raise NotImplementedError


class Batched(System):
    """verl (colocated, on-policy), one-step staleness and stream generation: the global batch
    spread over all replicas, a global weight sync between batches.

    Batch j may start generating when version >= j − lag; one-step and verl train batch j once
    it is complete; stream trains each mini-batch (32 groups) as soon as it is complete."""

    lag = 0
    stream = False

    def start(self) -> None:
        self.started = 0
        self.gen_s: list[float] = []  # generation time of each batch
        self.gen_began = 0.0
        self.in_flight = 0
        self.loaded = 0  # version on the rollouts
        self.trained_mb = 0  # mini-batches of the current iteration trained
        self.next_gen()

    def next_gen(self) -> None:
        if self.in_flight or self.started - self.version > self.lag:
            return
        if self.colocated and self.trainer_busy:
            return
        if self.loaded < self.version:  # global sync before the batch
            cost = self.sync_cost()
            self.waits.append(cost)
            self.trainer_stall += cost
            self.loaded = self.version
            for r in self.replicas:
                r.set_busy(True)
            self.in_flight = -1
            self.clock.at(self.clock.now + cost, self._synced)
            return
        self.started += 1
        self.gen_began = self.clock.now
        self.in_flight = self.p.batch
        groups = [self.new_group(self.loaded) for _ in range(self.p.prompts)]
        for i, r in enumerate(self.replicas):
            r.version = self.loaded
            r.add(s for g in groups[i::len(self.replicas)] for s in g)

    def _synced(self) -> None:
        self.in_flight = 0
        for r in self.replicas:
            r.set_busy(False)
        self.next_gen()

    def sync_cost(self) -> float:
        return self.nccl_sync_s()

    def simulate(self) -> dict[str, Any]:
        out = super().simulate()
        gen = self.gen_s[self.p.warmup:] or self.gen_s
        out["gen_share"] = sum(gen) / len(gen) / out["iteration_s"]
        return out

    def on_finished(self, s: Seq, r: Replica) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.gen_s.append(self.clock.now - self.gen_began)
            self.next_gen()
        self.maybe_train()

    def maybe_train(self) -> None:
        if self.trainer_busy:
            return
        ready = drive(self.buffer.ready())
        mb = self.p.prompts // self.p.minibatches
        if self.stream:
            if ready < mb:
                return
            tokens, trajs = self.sample(mb)
            steps = 1
        else:
            if ready < self.p.prompts:
                return
            tokens, trajs = self.sample(self.p.prompts)
            steps = self.p.minibatches
        self.trainer_busy = True
        self.pending_tokens = getattr(self, "pending_tokens", 0) + tokens
        self.clock.at(self.clock.now + self.train_time(tokens, steps, seq_tokens(trajs)), self._trained, steps)

    def _trained(self, steps: int) -> None:
        self.trainer_busy = False
        self.trained_mb += steps
        if self.trained_mb >= self.p.minibatches:
            self.trained_mb = 0
            tokens, self.pending_tokens = self.pending_tokens, 0
            self.publish(tokens)
            self.next_gen()
        self.maybe_train()


class Verl(Batched):
    """verl v0.5 colocated: generate on all GPUs, then train on all GPUs, then reshard."""

    name = "verl"
    colocated = True

    def sync_cost(self) -> float:
        """Colocated resharding: each GPU gathers its rollout shard over NVLink (400 GB/s)
        inside the machine, then the engine wakes (reload, cache reset)."""
        m, p = self.model, self.p
        return m.weight_bytes / self.tp() / p.nvlink_bps + p.engine_reload_s


class OneStep(Batched):
    name = "one-step"
    lag = 1


class Stream(Batched):
    name = "stream"
    lag = 1
    stream = True


class Continuous(System):
    """Rollouts that hold up to `concurrency` trajectories each (AReaL, Laminar); the trainer
    takes 512 whole groups (FIFO) whenever they are ready."""

    def tp(self) -> int:
        return self.model.rollout_tp

    def refill_groups(self, r: Replica) -> int:
        return (self.p.concurrency - r.held) // self.p.group

    def give(self, r: Replica, version: int) -> None:
        k = self.refill_groups(r)
        if k > 0:
            r.add(s for _ in range(k) for s in self.new_group(version))

    def maybe_train(self) -> None:
        if self.trainer_busy or drive(self.buffer.ready()) < self.p.prompts:
            return
        tokens, trajs = self.sample(self.p.prompts)
        self.trainer_busy = True
        self.clock.at(self.clock.now + self.train_time(tokens, self.p.minibatches, seq_tokens(trajs)), self._trained,
                      tokens)

    def _trained(self, tokens: int) -> None:
        raise NotImplementedError


class AReaL(Continuous):
    """AReaL v0.3: stream generation with partial rollout, staleness unbounded, Megatron
    trainer, SGLang rollouts. Every update goes through storage (realhf's GserverManager:
    flush every server, update_weights_from_disk -- a global sync), then every running
    sequence is re-prefilled under the new weights (its KV was computed by the old ones)."""

    name = "areal"
    eager = False

    def mixed_prefill(self) -> bool:
        return bool(self.p.sglang_mixed_chunk)

    def dp_units(self) -> int:
        return max(1, self.train_gpus // (self.model.mega_tp * self.model.mega_pp))

    def train_time(self, tokens: float, steps: int, lengths: list[float] | None = None) -> float:
        """AReaL trains with Megatron (paper App. A.2: TP×PP 2×1 / 4×2 / 4×4, DP = the rest):
        the same FLOPs, a 1F1B pipeline bubble of (PP − 1) micro-batch slots per step (each DP
        rank's share of a mini-batch, cut into micro-batches of at most `micro_tokens`), and
        per step the distributed optimizer's reduce-scatter of fp32 gradients and all-gather
        of bf16 parameters of each rank's TP×PP shard across the DP ranks over the NICs. As for
        FSDP, a step waits for its most loaded DP rank (`step_loads`)."""
        p, m = self.p, self.model
        shard = m.mega_tp * m.mega_pp
        dp = self.dp_units()
        unit_rate = shard * p.gpu_flops * p.mfu_train
        comm = (p.grad_reduce_bytes + 2) * m.params / shard * (dp - 1) / dp / p.nic_bps
        total = 0.0
        for load in step_loads(tokens, steps, dp, lengths):
            micro = max(1, math.ceil(load / p.micro_tokens))
            compute = (p.train_flops + p.logprob_flops) * m.params * load / unit_rate
            bubble = (micro + m.mega_pp - 1) / micro
            total += compute * bubble + comm
        return total

    def start(self) -> None:
        self.loaded_version = 0
        self.reload_starts: list[float] = []
        for r in self.replicas:
            self.give(r, 0)
        self.clock.at(self.p.gserver_poll_s, self.poll)

    def on_finished(self, s: Seq, r: Replica) -> None:
        if not r.busy:
            self.give(r, r.version)
        self.maybe_train()

    def poll(self) -> None:
        """realhf's GserverManager loop: look for a newer version on storage; if there is one,
        update every server with it (a global sync) and only then sleep `gserver_poll_s`. The
        update runs inside the poll, so a version saved during a reload waits for it to end."""
        if self.version > self.loaded_version:
            self.reload(self.version)
        else:
            self.clock.at(self.clock.now + self.p.gserver_poll_s, self.poll)

    def reload(self, version: int) -> None:
        """Pause every server; running sequences lose their KV (partial rollout: they are
        re-prefilled through admission when the server resumes); load the newest version."""
        load = self.load_s()
        self.waits.append(load)
        self.reload_starts.append(self.clock.now)
        for r in self.replicas:
            r.set_busy(True)
            r.drop_kv()

        def loaded() -> None:
            self.loaded_version = version
            for r in self.replicas:
                r.version = max(r.version, version)
                for s in list(r.running) + list(r.waiting):
                    s.versions.add(r.version)
                r.set_busy(False)
                self.give(r, r.version)
            self.clock.at(self.clock.now + self.p.gserver_poll_s, self.poll)

        self.clock.at(self.clock.now + load, loaded)

    def save_s(self) -> float:
        """AReaL v0.3 (realhf) publishes weights through storage: each Megatron TP×PP rank
        serializes its shard and writes it to the parameter-reallocation directory."""
        p, m = self.p, self.model
        shard = m.weight_bytes / (m.mega_tp * m.mega_pp)
        return shard / p.storage_shard_bytes * (p.storage_serialize_s + p.storage_transfer_s)

    def load_s(self) -> float:
        """Every SGLang server is flushed and calls update_weights_from_disk: each TP rank reads
        the checkpoint back from storage -- all of it (`sglang_rank_reads_checkpoint`: the loader
        walks every file and keeps its slice), the ranks in parallel -- then the engine reloads."""
        p, m = self.p, self.model
        per_rank = m.weight_bytes if p.sglang_rank_reads_checkpoint else m.weight_bytes / self.tp()
        return per_rank / p.storage_shard_bytes * p.storage_transfer_s + p.engine_reload_s

    def _trained(self, tokens: int) -> None:
        """The trainer stalls while it saves; once the new version is on storage the manager
        picks it up at its next poll (`poll`)."""
        save = self.save_s()
        self.trainer_stall += save

        def saved() -> None:
            self.trainer_busy = False
            self.publish(tokens)
            self.maybe_train()

        self.clock.at(self.clock.now + save, saved)


class Laminar(Continuous):
    """Relays (push, chain broadcast, PCIe pull), per-replica batches, Best-Fit repack."""

    name = "laminar"

    def __init__(self, p: Params, model: str, gpus: int, opts: Options | None = None) -> None:
        super().__init__(p, model, gpus, opts)
        self.relay_at: list[tuple[float, int]] = [(0.0, 0)]  # (arrival at every relay, version)
        self.pulling: set[Replica] = set()
        self.repacked: set[str] = set()
        self.move_costs: list[float] = []
        self.trajs_per_move: list[int] = []

    def start(self) -> None:
        for r in self.replicas:
            self.take_batch(r)
        if self.opts.repack:
            self.clock.at(self.p.repack_interval_s, self.periodic_repack)

    def refill_groups(self, r: Replica) -> int:
        """A batch per pull: the replica's share of a global batch (`rollout_batch_share`), but at
        least enough to fill its KV cache (`rollout_batch_fill_kv`, §5.2's ramp-up and plateau),
        capped at `concurrency`; the paper's cap alone when the share is off."""
        p = self.p
        cap = p.concurrency // p.group
        if not p.rollout_batch_share:
            return cap - r.held // p.group
        want = -(-p.prompts // len(self.replicas))
        if p.rollout_batch_fill_kv:
            want = max(want, math.ceil(r.cap / (p.prompt_tokens + mean_response(p)) / p.group))
        return min(cap, want) - r.held // p.group

    def take_batch(self, r: Replica) -> None:
        r.c_peak = 0.0
        self.give(r, r.version)

    # -- weights ----------------------------------------------------------------------------

    def relays(self) -> int:
        return max(2, -(-self.roll_gpus // self.p.gpus_per_node))

    def broadcast_s(self) -> float:
        p, m = self.p, self.model
        n = self.relays()
        if self.opts.relay_chunk_bytes is None:
            k = best_chunk_count(n, m.weight_bytes, 1 / p.relay_bps, p.rdma_start_s)
        else:
            k = max(1, math.ceil(m.weight_bytes / self.opts.relay_chunk_bytes))
        return broadcast_time(n, k, m.weight_bytes, 1 / p.relay_bps, p.rdma_start_s)

    def push_s(self) -> float:
        return self.model.weight_bytes / self.p.relay_bps

    def pull_s(self) -> float:
        """PCIe load of the local relay's copy, then the same engine reload as any sync."""
        return self.model.weight_bytes / self.tp() / self.p.pcie_bps + self.p.engine_reload_s

    def local_version(self) -> int:
        return max(v for t, v in self.relay_at if t <= self.clock.now + 1e-9)

    def on_finished(self, s: Seq, r: Replica) -> None:
        self.maybe_train()

    def on_empty(self, r: Replica) -> None:
        """Batch done (or released by repack): pull the newest weights, take a new batch."""
        if r.held or r in self.pulling:
            return
        target, arrive = self.local_version(), self.clock.now
        if self.opts.fetch_policy == "wait_inflight" and self.relay_at[-1][1] > target:
            arrive, target = self.relay_at[-1]
        if target == r.version:
            self.take_batch(r)
            return
        self.pulling.add(r)
        r.busy = True
        wait = arrive - self.clock.now + self.pull_s()
        self.waits.append(wait)
        if arrive > self.clock.now:  # the paper's slower case: the broadcast is still in flight
            self.counters["pulls_waited_for_broadcast"] += 1

        def loaded() -> None:
            self.pulling.discard(r)
            r.version = target
            r.busy = False
            r.last = max(r.last, self.clock.now)
            self.take_batch(r)

        self.clock.at(self.clock.now + wait, loaded)

    def _trained(self, tokens: int) -> None:
        stall = self.push_s()
        self.trainer_stall += stall

        def pushed() -> None:
            self.trainer_busy = False
            self.publish(tokens)
            self.relay_at.append((self.clock.now + self.broadcast_s(), self.version))
            self.clock.at(self.relay_at[-1][0], self.wake_idle)
            if self.opts.repack:
                self.repack(after_update=True)
            self.maybe_train()

        self.clock.at(self.clock.now + stall, pushed)

    def wake_idle(self) -> None:
        for r in self.replicas:
            if not r.held:
                self.on_empty(r)

    # -- repack -----------------------------------------------------------------------------

    def periodic_repack(self) -> None:
        self.repack()
        if not self.done():
            self.clock.at(self.clock.now + self.p.repack_interval_s, self.periodic_repack)

    def repack(self, after_update: bool = False) -> None:
        """agentrl's manager code: loads grouped by version -> Algorithm 1 -> move everything.
        `after_update`: §5.1's second trigger (right after a weight update), counted apart from
        the periodic check: its sources pull while the new version is still on its way."""
        by_id = {r.id: r for r in self.replicas}
        loads = [r.load() for r in self.replicas if r not in self.pulling]
        b = roofline_batch(self.p, self.model)
        for _version, group in repack_inputs(loads, self.opts.idle_rule).items():
            for src, dst in best_fit_repack(group, self.p.c_max, b):
                s, d = by_id[src], by_id[dst]
                moved = s.take_all()
                if not moved:
                    continue
                d.stall(self.p.rpc_s + self.p.repack_decision_s)
                before = d.stall_until
                d.add(moved, front=True)
                self.move_costs.append(self.p.rpc_s + self.p.repack_decision_s + d.stall_until - before)
                self.trajs_per_move.append(len(moved))
                self.repacked.update(x.id for x in moved)
                self.counters["repack_moves"] += 1
                if after_update:
                    self.counters["repack_moves_after_update"] += 1
                self.on_empty(s)

    def simulate(self) -> dict[str, Any]:
        out = super().simulate()
        out["repack_move_cost_s"] = sum(self.move_costs) / len(self.move_costs) if self.move_costs else 0.0
        for k in ("repack_moves", "repack_moves_after_update", "pulls_waited_for_broadcast"):
            out.setdefault(k, 0)  # counters are absent until they count
        out["relay_broadcast_s"] = self.broadcast_s()
        out["relays"] = self.relays()
        # the one controller process's share of a core at this completion rate (agentrl's measured
        # cost per trajectory): above 1 it, not the GPUs, would bound the run
        trajectories_per_s = self.p.prompts * self.p.group / out["iteration_s"]
        out["controller_cores"] = trajectories_per_s * self.p.controller_cpu_s_per_traj
        return out


class LaminarNoRepack(Laminar):
    name = "laminar-no-repack"

    def __init__(self, p: Params, model: str, gpus: int, opts: Options | None = None) -> None:
        super().__init__(p, model, gpus, replace(opts or Options(), repack=False))


class April(Batched):
    """Beyond the paper: partial rollout with interruption + global sync (APRIL-style, on the
    colocated verl loop). Each iteration keeps 2× the batch in flight; once 512 groups are
    complete the rest is aborted and kept, the trainer trains and syncs, and the aborted
    trajectories resume under the new weights (re-prefill, mixed versions)."""

    name = "april"
    colocated = True
    overprovision = 2.0  # APRIL's README: launch more rollouts than the batch needs

    def start(self) -> None:
        self.parked: list[Seq] = []
        self.gen_s = []
        self.group_left: Counter[str] = Counter()
        self.done_groups = 0
        self.generating = False
        self.gen_round()

    def gen_round(self) -> None:
        self.generating = True
        self.gen_began = self.clock.now
        self.done_groups = 0
        want = int(self.p.prompts * self.overprovision) - len({s.group for s in self.parked})
        seqs = self.parked
        self.parked = []
        for s in seqs:
            s.versions.add(self.version)
        for _ in range(max(0, want)):
            g = self.new_group(self.version)
            self.group_left[g[0].group] = len(g)
            seqs += g
        for i, r in enumerate(self.replicas):
            r.version = self.version
            r.add(seqs[i::len(self.replicas)])

    def on_finished(self, s: Seq, r: Replica) -> None:
        self.group_left[s.group] -= 1
        if self.group_left[s.group] == 0:
            del self.group_left[s.group]
            self.done_groups += 1
        if self.generating and self.done_groups >= self.p.prompts:
            self.generating = False
            self.gen_s.append(self.clock.now - self.gen_began)
            for rr in self.replicas:
                self.parked += rr.take_all()
            tokens, trajs = self.sample(self.p.prompts)
            cost = self.train_time(tokens, self.p.minibatches, seq_tokens(trajs)) + Verl.sync_cost(self)  # type: ignore[arg-type]
            self.clock.at(self.clock.now + cost, self._round_done, tokens)

    def _round_done(self, tokens: int) -> None:
        self.publish(tokens)
        self.gen_round()


SYSTEMS: dict[str, type[System]] = {"verl": Verl, "one-step": OneStep, "stream": Stream, "areal": AReaL,
                                    "laminar": Laminar, "laminar-no-repack": LaminarNoRepack, "april": April}
PAPER_SYSTEMS = ("verl", "one-step", "stream", "areal", "laminar")
SCALES = {"7B": (16, 32, 64, 128, 256), "32B": (32, 64, 128, 256, 512), "72B": (64, 128, 256, 512, 1024)}


def roofline_batch(p: Params, m: Model) -> int:
    """B of Algorithm 1: the decode batch where the weight-read time equals the compute time."""
    return max(1, int(p.gpu_flops * p.mfu_decode / (p.hbm_bps * p.hbm_util)))


def run_system(name: str, p: Params, model: str, gpus: int, opts: Options | None = None) -> dict[str, Any]:
    return SYSTEMS[name](p, model, gpus, opts).simulate()


def run_scale(p: Params, model: str, gpus: int, systems: Iterable[str] = PAPER_SYSTEMS,
              opts: Options | None = None) -> dict[str, Any]:
    out = {s: run_system(s, p, model, gpus, opts) for s in systems}
    return out


# ---------------------------------------------------------------------------------------------
# calibration against the paper
# ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    figure: str
    paper: float
    sim: float
    kind: str = "predicted"  # or "fitted": a parameter was chosen from this figure

    @property
    def ratio(self) -> float:
        return self.sim / self.paper


def _strip(r: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in r.items() if not k.endswith("staleness_hist")}


def _point(args: tuple[Params, str, int, tuple[str, ...]]) -> tuple[str, int, dict[str, Any], float]:
    p, model, g, systems = args
    t0 = time.perf_counter()
    return model, g, run_scale(p, model, g, systems), time.perf_counter() - t0


def run_grid(p: Params, points: list[tuple[str, int]], jobs: int = 1, log: Callable[[str], None] = lambda s: None,
             systems: Iterable[str] = PAPER_SYSTEMS) -> dict[str, dict[int, dict[str, Any]]]:
    """Every system at every (model, GPUs) point; `jobs` processes (points are independent)."""
    grid: dict[str, dict[int, dict[str, Any]]] = {}
    work = [(p, m, g, tuple(systems)) for m, g in points]
    if jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            results = list(pool.imap_unordered(_point, work))
    else:
        results = [_point(w) for w in work]
    for model, g, res, wall in sorted(results, key=lambda r: (list(SCALES).index(r[0]), r[1])):
        grid.setdefault(model, {})[g] = res
        log(f"{model} {g:5d} GPUs  {({s: round(v['tokens_per_s']) for s, v in res.items()})}  ({wall:.1f} s)")
    return grid


def calibrate(p: Params, jobs: int = 1,
              log: Callable[[str], None] = lambda s: None) -> tuple[list[Row], dict[str, Any]]:
    """Every math-task figure of the paper (§8, App. B, Table 1) against the simulator."""
    grid = run_grid(p, [(m, g) for m, scales in SCALES.items() for g in scales], jobs, log)
    rows: list[Row] = []

    def speedups(base: str) -> list[float]:
        return [grid[m][g]["laminar"]["tokens_per_s"] / grid[m][g][base]["tokens_per_s"]
                for m in grid for g in grid[m]]

    names = {"verl": "verl", "one-step": "one-step staleness", "stream": "stream generation", "areal": "AReaL"}
    paper_avg = {"verl": 2.56, "one-step": 1.98, "stream": 1.93, "areal": 1.39}
    paper_max = {"verl": 5.49, "one-step": 4.09, "stream": 4.06, "areal": 1.81}
    for b in names:
        sp = speedups(b)
        rows.append(Row(f"laminar / {names[b]}, average", paper_avg[b], sum(sp) / len(sp)))
        rows.append(Row(f"laminar / {names[b]}, max", paper_max[b], max(sp)))
    largest = [grid[m][max(grid[m])]["laminar"]["tokens_per_s"] / grid[m][max(grid[m])][b]["tokens_per_s"]
               for m in grid for b in names]
    rows.append(Row("average speedup at the largest scales (all baselines, models)", 3.34, sum(largest) / len(largest)))
    small = [grid[m][g]["laminar"]["tokens_per_s"] / grid[m][g][b]["tokens_per_s"]
             for m in grid for g in grid[m] if g <= 64 for b in names]
    rows.append(Row("average speedup at <= 64 GPUs", 1.41, sum(small) / len(small)))

    def efficiency(system: str, model: str) -> float:
        lo, hi = min(grid[model]), max(grid[model])
        return grid[model][hi][system]["tokens_per_s"] / grid[model][lo][system]["tokens_per_s"] / (hi / lo)

    lam = {m: efficiency("laminar", m) for m in grid}
    are = {m: efficiency("areal", m) for m in grid}
    share = [grid[m][g]["verl"]["gen_share"] for m in grid for g in grid[m]]
    rows.append(Row("verl: generation share of the iteration (up to; Fig. 1b)", 0.831, max(share)))
    rows.append(Row("strong-scaling efficiency, laminar (avg of models)", 0.537, sum(lam.values()) / 3))
    rows.append(Row("strong-scaling efficiency, laminar 32B", 0.682, lam["32B"]))
    rows.append(Row("strong-scaling efficiency, AReaL (avg of models)", 0.336, sum(are.values()) / 3))
    rows.append(Row("strong-scaling efficiency, AReaL (best model)", 0.392, max(are.values())))

    # §8.4 / Table 1: 32B on 128 GPUs, 64 train + 64 rollout (16 replicas, TP 4)
    rep = {s: run_system(s, p, "32B", 128) for s in ("laminar", "laminar-no-repack")}
    w, wo = rep["laminar"], rep["laminar-no-repack"]
    rows.append(Row("repack: generation throughput gain", 1.26, w["gen_tokens_per_s"] / wo["gen_tokens_per_s"]))
    rows.append(Row("repack: KV utilisation with repack", 0.822, w["kv_util"]))
    rows.append(Row("repack: KV utilisation without repack", 0.716, wo["kv_util"]))
    rows.append(Row("repack: overhead per move (s)", 0.69, w["repack_move_cost_s"], "fitted"))
    rows.append(Row("trajectory latency avg/max, no repack", 296 / 826,
                    wo["latency_avg_s"] / wo["latency_max_s"], "fitted"))
    rows.append(Row("trajectory latency max, repack / no repack", 828 / 826, w["latency_max_s"] / wo["latency_max_s"]))
    rows.append(Row("trajectory latency avg, repack / no repack", 290 / 296, w["latency_avg_s"] / wo["latency_avg_s"]))
    # §8.3: actor stall; App. D: relay broadcast
    lam32 = Laminar(p, "32B", 128)
    lam72 = Laminar(p, "72B", 1024)
    rows.append(Row("actor stall on weight push, 32B (s)", 0.64, lam32.push_s(), "fitted"))
    rows.append(Row("actor stall on weight push, 72B (s)", 1.40, lam72.push_s()))
    bc = optimal_broadcast_time(128, MODELS["72B"].weight_bytes, 1 / p.relay_bps, p.rdma_start_s)
    rows.append(Row("relay broadcast 72B to 127 relays (s, paper: < 1.6)", 1.6, bc))
    # §8.3 Fig. 14: rollout wait, relay (PCIe from local relay) vs NCCL global sync
    best = [(Laminar(p, m, g).pull_s(), Laminar(p, m, g).nccl_sync_s()) for m in grid for g in grid[m]]
    rows.append(Row("rollout wait, best-case reduction vs NCCL (up to)", 0.47, max(1 - a / b for a, b in best),
                    "fitted"))
    avg_red = []
    for m in grid:
        for g in grid[m]:
            a, b = grid[m][g]["laminar"]["rollout_wait_s"], Laminar(p, m, g).nccl_sync_s()
            avg_red.append(1 - a / b)
    rows.append(Row("rollout wait, average reduction vs NCCL (up to)", 0.37, max(avg_red)))
    stale = max(grid[m][g]["laminar"]["staleness_max"] for m in grid for g in grid[m])
    rows.append(Row("laminar max staleness (observed)", 4, stale))
    return rows, {"grid": {m: {g: {s: _strip(v) for s, v in d.items()} for g, d in grid[m].items()} for m in grid},
                  "repack": {k: _strip(v) for k, v in rep.items()}}


def print_table(rows: list[Row]) -> tuple[float, float]:
    print(f"| {'figure':<66} | {'paper':>8} | {'sim':>8} | {'sim/paper':>9} | kind |")
    print(f"|{'-' * 68}|{'-' * 10}|{'-' * 10}|{'-' * 11}|------|")
    for r in rows:
        print(f"| {r.figure:<66} | {r.paper:8.3f} | {r.sim:8.3f} | {r.ratio:9.3f} | {r.kind} |")
    pred = [abs(r.ratio - 1) for r in rows if r.kind == "predicted"]
    every = [abs(r.ratio - 1) for r in rows]
    return max(pred), max(every)


# ---------------------------------------------------------------------------------------------
# beyond the paper, sweeps, plots
# ---------------------------------------------------------------------------------------------


def beyond(p: Params, model: str = "7B", gpus: int = 256) -> list[dict[str, Any]]:
    """agentrl's choices against the paper's, one knob at a time, on the paper's placement."""
    variants = [
        ("paper: idle from the start of the fall, wait for in-flight, k* chunks", Options()),
        ("repack idle rule: C_used < C_prev (pseudocode)", Options(idle_rule="prev")),
        ("fetch policy: local (never wait for a broadcast)", Options(fetch_policy="local")),
        ("relay chunking: agentrl's fixed 16 MiB chunks", Options(relay_chunk_bytes=16 * 1024 * 1024)),
        ("relay chunking: 1 GiB chunks", Options(relay_chunk_bytes=1024**3)),
        ("staleness bound: max_staleness=2 (evict older groups)", Options(max_staleness=2)),
        ("no repack", Options(repack=False)),
    ]
    out = []
    for label, o in variants:
        r = run_system("laminar", p, model, gpus, o)
        out.append({"variant": label, "tokens_per_s": r["tokens_per_s"], "staleness_max": r["staleness_max"],
                    "evicted": r["evicted_groups"], "rollout_wait_s": r["rollout_wait_s"],
                    "broadcast_s": r["relay_broadcast_s"]})
    for name in ("april", "verl", "areal"):
        r = run_system(name, p, model, gpus)
        out.append({"variant": f"baseline: {name}", "tokens_per_s": r["tokens_per_s"],
                    "staleness_max": r["staleness_max"], "evicted": 0, "rollout_wait_s": r["rollout_wait_s"],
                    "broadcast_s": 0.0})
    return out


def sweep(p: Params, model: str, gpus: list[int], systems: Iterable[str],
          jobs: int = 1) -> dict[int, dict[str, Any]]:
    return run_grid(p, [(model, g) for g in gpus], jobs, lambda s: print(s, file=sys.stderr), systems)[model]


def plot(results: dict[int, dict[str, Any]], model: str, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    gpus = sorted(results)
    systems = list(results[gpus[0]])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for s in systems:
        ax.plot(gpus, [results[g][s]["tokens_per_s"] / 1e3 for g in gpus], marker="o", label=s)
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("training throughput (K tokens/s)")
    ax.set_title(f"simulated math RL, Qwen2.5-{model}, batch 8192 (strong scaling)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    f1 = out / f"sim_throughput_{model}.png"
    fig.savefig(f1, dpi=110)
    plt.close(fig)
    g = max(gpus)
    fig, axes = plt.subplots(1, len(systems), figsize=(2.2 * len(systems), 2.6), sharey=True)
    for ax, s in zip(axes, systems):
        for key, dx, label in (("staleness_hist", -0.2, "at finish (paper's M − K)"),
                               ("consumed_staleness_hist", 0.2, "at consumption")):
            hist = {int(k): v for k, v in results[g][s][key].items()}
            total = sum(hist.values()) or 1
            ks = sorted(hist)
            ax.bar([k + dx for k in ks], [hist[k] / total for k in ks], width=0.4, label=label)
        ax.set_title(s, fontsize=9)
        ax.set_xlabel("staleness")
    axes[0].set_ylabel("share of trajectories")
    axes[0].legend(fontsize=6)
    fig.suptitle(f"staleness (trainer version − generating version), {model}, {g} GPUs", fontsize=9)
    fig.tight_layout()
    f2 = out / f"sim_staleness_{model}_{g}.png"
    fig.savefig(f2, dpi=110)
    plt.close(fig)
    return [f1, f2]


def load_avg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibrate", action="store_true", help="the paper's figures against the simulator")
    ap.add_argument("--sweep", action="store_true", help="throughput vs GPUs for every system")
    ap.add_argument("--beyond", action="store_true", help="agentrl's knobs vs the paper's, plus APRIL")
    ap.add_argument("--params", action="store_true", help="print every parameter with its source")
    ap.add_argument("--gpus", type=int, default=256, help="GPUs in the cluster (16..1024)")
    ap.add_argument("--model", choices=sorted(MODELS), default="7B")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    ap.add_argument("--plots", type=Path, default=None, help="write PNGs here (with --sweep)")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (1 warm-up, 2 measured)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="processes for independent points (--calibrate, --sweep)")
    args = ap.parse_args(argv)
    p = Params(seed=args.seed)
    if args.quick:
        p = replace(p, warmup=1, iterations=2)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        ap.error(f"--systems: unknown {bad}; choose from {', '.join(SYSTEMS)}")
    if args.gpus < 8:
        ap.error("--gpus must be >= 8")
    t0 = time.perf_counter()
    load0 = load_avg()
    if args.params:
        for f in fields(Params):
            print(f"{f.name:24} {getattr(p, f.name)!s:>14}  {f.metadata['source']}")
        return
    if args.calibrate:
        rows, _detail = calibrate(p, args.jobs, log=lambda s: print(s, file=sys.stderr))
        worst_pred, worst_all = print_table(rows)
        print(json.dumps({"calibration_max_rel_err": round(worst_pred, 3),
                          "calibration_max_rel_err_incl_fitted": round(worst_all, 3),
                          "rows": [{"figure": r.figure, "paper": r.paper, "sim": round(r.sim, 4), "kind": r.kind}
                                   for r in rows],
                          "wall_s": round(time.perf_counter() - t0, 1), "load_avg": [load0, load_avg()]},
                         separators=(",", ":")))
        return
    if args.beyond:
        out = beyond(p, args.model, args.gpus)
        for r in out:
            print(f"{r['variant']:<70} {r['tokens_per_s']:10.0f} tok/s  max staleness {r['staleness_max']}",
                  file=sys.stderr)
        print(json.dumps({"beyond": out, "model": args.model, "gpus": args.gpus,
                          "wall_s": round(time.perf_counter() - t0, 1), "load_avg": [load0, load_avg()]},
                         separators=(",", ":")))
        return
    if args.sweep:
        gpus = [64, 128, 256, 512, 1024]
        res = sweep(p, args.model, gpus, systems, args.jobs)
        files = plot(res, args.model, args.plots) if args.plots else []
        print(json.dumps({"model": args.model, "sweep": {g: {s: _strip(v) for s, v in d.items()} for g, d in res.items()},
                          "consumed_staleness_hist_1024": {s: res[1024][s]["consumed_staleness_hist"]
                                                           for s in systems},
                          "plots": [str(f) for f in files], "wall_s": round(time.perf_counter() - t0, 1),
                          "load_avg": [load0, load_avg()]}, separators=(",", ":")))
        return
    res = run_scale(p, args.model, args.gpus, systems)
    lam = res.get("laminar", {}).get("tokens_per_s")
    ratios = {f"laminar_over_{s}": round(lam / v["tokens_per_s"], 3) for s, v in res.items()
              if lam and s != "laminar"}
    print(json.dumps({"gpus": args.gpus, "model": args.model, "systems": res, **ratios,
                      "wall_s": round(time.perf_counter() - t0, 1), "load_avg": [load0, load_avg()]},
                     separators=(",", ":")))


if __name__ == "__main__":
    main()
