"""Data-parallel, sharded learner (issue 16): `trainer.num_learners=N` runs N learner processes in
one torch.distributed group (gloo on CPU, NCCL on GPU) with FSDP2 `fully_shard` on every decoder
layer and on the root, so each rank holds 1/N of the weights, gradients and Adam state. Locally the
ranks are spawned processes on loopback; with `--ray` they are Ray actors in one placement group
(`trainer.learner_num_gpus` / `learner_num_cpus` each) that meet at rank 0's node.

Every rank runs the same `Learner.step` on the whole global batch (the same seeded shuffle, the
same advantages); in the mini-batch loop each rank forwards its own micro-batches (round-robin)
and FSDP's reduce-scatter sums the gradients. `DistributedLearner` is the driver-side facade the
training loop talks to: the same `step` / `version` / `state_dict_for_inference` /
`training_state` as `Learner`, backed by N spawned worker processes.

    learner = DistributedLearner(model_path, cfg.trainer, num_learners=2, temperature=1.0)
    metrics = learner.step(groups)          # every rank trains; rank 0's metrics come back
    weights = learner.state_dict_for_inference()   # gathered tensor by tensor on the ranks
    learner.close()
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard

from agentrl.config import ModelConfig, RewardConfig, TrainerConfig, WarmStartConfig
from agentrl.errors import UserError
from agentrl.inference.cpu.memory import LEARNER_MMAP_THRESHOLD, set_mmap_threshold
from agentrl.models import resolve_configured, resolve_device
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.learner import Learner, adapter_items, hf_name, make_optimizer
from agentrl.trainer.logprobs import TokenStats, token_logprobs_and_stats
from agentrl.trainer.sft import sft_steps


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of an HF causal LM (`model.model.layers`), the FSDP2 sharding units."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers to shard; FSDP2 needs a decoder stack")
    return list(layers)


class PolicyForward(torch.nn.Module):
    """The FSDP2 root: the decoder body and the policy-token LM head run inside one forward, so
    the root's own parameters (embeddings, final norm, tied head) are gathered for both and their
    gradients reduced after backward. Returns a tuple, which FSDP's output hooks can walk."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None, temperature: float, positions: Tensor,
                entropy: bool, sum_pi_sq: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
        st = token_logprobs_and_stats(self.lm, input_ids, attention_mask, temperature, positions=positions,
                                      entropy=entropy, sum_pi_sq=sum_pi_sq)
        return st.logprobs, st.entropy, st.sum_pi_sq


def _gather(t: Tensor) -> Tensor:
    """The full tensor on the CPU (an all-gather for an FSDP2 shard: every rank must call it)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().to("cpu")


class ShardedLearner(Learner):
    """A `Learner` whose model is FSDP2-sharded over the default process group."""

    def __init__(self, model: str | Path | torch.nn.Module, cfg: TrainerConfig, temperature: float = 1.0,
                 reward_cfg: RewardConfig | None = None, device: str = "cpu") -> None:
        super().__init__(model, cfg, temperature, reward_cfg, device)
        # The policy, and the frozen reference of the k3 KL (kl_coef > 0) the same way: each rank
        # holds 1/N of either. Every rank runs the reference over the whole batch (_recompute), so
        # their all-gathers line up.
        self.roots: dict[int, PolicyForward] = {}
        for lm in (self.model, self.ref_model):
            if lm is not None:
                for layer in decoder_layers(lm):
                    fully_shard(layer)
                self.roots[id(lm)] = PolicyForward(lm)
                fully_shard(self.roots[id(lm)])
        self.policy = self.roots[id(self.model)]
        # The optimizer must hold the sharded (DTensor) parameters, so it is built again.
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(params, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.scheduler.lr_lambdas[0])
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def _forward(self, model: torch.nn.Module, mb: TrainBatch, entropy: bool, sum_pi_sq: bool,
                 temperature: float | None = None) -> TokenStats:
        root = self.roots[id(model)]
        root.train(model.training)
        with self._autocast():
            lp, ent, sq = root(mb.input_ids.to(self.device), mb.attention_mask.to(self.device),
                               temperature or self.temperature, mb.loss_mask.to(self.device), entropy, sum_pi_sq)
        return TokenStats(logprobs=lp, entropy=ent, sum_pi_sq=sq)

    def _tied(self) -> dict[str, str]:
        """Weight name -> the first name of the same parameter, for tied weights (an LM head that
        is the embedding). Parameter identity, not storage, so that every rank agrees."""
        first: dict[int, str] = {}
        return {name: src for name, p in self.model.named_parameters(remove_duplicate=False)
                if (src := first.setdefault(id(p), name)) != name}

    def weight_items(self) -> Iterator[tuple[str, Tensor]]:
        """Each full weight under its HF name, in turn (an all-gather of one tensor: every rank
        iterates); a tied name yields the tensor already gathered for its twin, so a relay stores
        it once. LoRA: each adapted weight is its base plus the gathered adapters' B·A·scale,
        what the engines load (as `hf_weight_items` merges them on one learner; peft's own
        `get_delta_weight` cannot take the sharded adapters)."""
        tied = self._tied()
        twins: dict[str, Tensor] = {}
        state = self.model.state_dict()
        for k, v in state.items():
            if ".lora_" in k:
                continue
            if tied.get(k) in twins:
                yield hf_name(k), twins[tied[k]]
                continue
            full = _gather(v)
            if ".base_layer." in k and k.endswith(".weight"):
                prefix = k.split(".base_layer.")[0]
                scale = self.model.get_submodule(prefix).scaling["default"]
                full = full + _gather(state[f"{prefix}.lora_B.default.weight"]) @ _gather(
                    state[f"{prefix}.lora_A.default.weight"]) * scale
            if k in tied.values():
                twins[k] = full
            yield hf_name(k), full

    def adapter_views(self) -> dict[str, Tensor]:
        """The LoRA adapters, each gathered in full (every rank must call it), under peft's names."""
        if not self.lora:
            raise ValueError("adapter_views: this learner trains no LoRA adapters (trainer.lora.rank=0)")
        return {k: _gather(v) for k, v in adapter_items(self.model)}

    def weight_meta(self) -> list[tuple[str, tuple[int, ...], str, str | None]]:
        """(HF name, full shape, dtype, tied-to name) of each weight `weight_items` yields,
        without gathering any: what a relay lays its buffer out from before a streamed push."""
        tied = self._tied()
        return [(hf_name(k), tuple(v.shape), str(v.dtype).removeprefix("torch."),
                 hf_name(tied[k]) if k in tied else None)
                for k, v in self.model.state_dict().items() if ".lora_" not in k]

    def _model_and_optimizer_state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Full (unsharded) model and optimizer state, as a single learner's: a checkpoint from
        N ranks resumes on any number of ranks."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # The gathered tensors are new, but unsharded entries (Adam's `step` counts) are the live
        # ones: the driver would hold tensors that keep changing (a pipe shares their memory).
        for param_state in optim_sd.get("state", {}).values():
            for k, v in param_state.items():
                if isinstance(v, Tensor) and not hasattr(v, "to_local"):
                    param_state[k] = v.clone()
        if self.lora:  # the adapter only, as a single learner checkpoints it
            model_sd = {k: v for k, v in model_sd.items() if ".lora_" in k}
        return model_sd, optim_sd

    def _own_state(self, model: torch.nn.Module) -> dict[str, Tensor]:
        """`model`'s full weights (gathered from the shards), as a single learner's checkpoint."""
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v for k, v in state.items() if ".lora_" in k} if self.lora else state

    @torch.no_grad()
    def reset_reference(self) -> None:
        """Each rank copies its policy shards into its reference shards. A forward leaves the
        frozen reference's root parameters (embedding, final norm, head) unsharded, since no
        backward reshards them, so both roots are resharded first and the shards line up."""
        if self.ref_model is not None:
            for lm in (self.model, self.ref_model):
                self.roots[id(lm)].reshard()
            for ref, param in zip(self.ref_model.parameters(), self.model.parameters(), strict=True):
                ref.to_local().copy_(param.to_local())

    def _load_reference(self, state: dict[str, Any]) -> None:
        if self.ref_model is not None and "reference" in state:
            self.roots[id(self.ref_model)].reshard()
            set_model_state_dict(self.ref_model, state["reference"],
                                 options=StateDictOptions(full_state_dict=True, strict=not self.lora))

    def _named_optimizer_state(self, optim: dict[str, Any]) -> dict[str, Any]:
        """A single learner's checkpoint keys Adam's state by parameter index (torch's own
        state_dict), the sharded one by parameter name: both optimizers hold the trainable
        parameters in `model.parameters()` order, so indices map to names one to one."""
        ids = [i for g in optim["param_groups"] for i in g["params"]]
        if all(isinstance(i, str) for i in ids):
            return optim
        names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        if len(ids) != len(names):
            raise KeyError(f"checkpoint optimizer holds {len(ids)} parameters, the model trains {len(names)}")
        name = dict(zip(ids, names))
        return {"state": {name[i]: s for i, s in optim["state"].items()},
                "param_groups": [{**g, "params": [name[i] for i in g["params"]]} for g in optim["param_groups"]]}

    def load_training_state(self, state: dict[str, Any]) -> None:
        missing = {"model", "optimizer", "scheduler", "generator", "version", "global_step"} - set(state)
        if missing:
            raise KeyError(f"training state lacks {sorted(missing)}")
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=self._named_optimizer_state(state["optimizer"]),
                       options=StateDictOptions(full_state_dict=True, strict=not self.lora))  # LoRA: adapter only
        # set_state_dict shards the tensors into new DTensors but keeps unsharded entries (Adam's
        # `step` counts) as given. The driver's state reaches every rank through a pipe that shares
        # tensor memory, so without a copy all ranks would step one shared counter (twice per step).
        for param_state in self.optimizer.state.values():
            for k, v in param_state.items():
                if isinstance(v, Tensor) and not hasattr(v, "to_local"):
                    param_state[k] = v.clone()
        self._load_reference(state)
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        self.version, self.global_step = int(state["version"]), int(state["global_step"])


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def init_group(rank: int, world: int, port: int, addr: str = "127.0.0.1", gpu: int | None = None) -> str:
    """Join the learners' group at addr:port: NCCL on this process's GPU `gpu`, else gloo on the
    CPU. Returns the rank's device."""
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port))
    if gpu is not None:
        torch.cuda.set_device(gpu)
    dist.init_process_group("nccl" if gpu is not None else "gloo", rank=rank, world_size=world)
    return f"cuda:{gpu}" if gpu is not None else "cpu"


def shard_bytes(learner: Learner) -> dict[str, int]:
    """Bytes this rank holds for weights and the optimizer state (local shards only)."""
    def local(t: Tensor) -> Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    weights = sum(local(p).numel() * local(p).element_size() for p in learner.model.parameters())
    optim = sum(local(v).numel() * local(v).element_size() for s in learner.optimizer.state.values()
                for v in s.values() if isinstance(v, Tensor) and v.dim() > 0)
    return {"weights": weights, "optimizer": optim}


class LearnerRank:
    """One rank of the sharded learner: joins the group, builds its `ShardedLearner` and answers
    the driver's commands — the same in a spawned process (`_worker`) and in a Ray actor
    (`RayLearnerRank`). Every rank takes part in each command; rank 0's result is the one kept."""

    def __init__(self, rank: int, world: int, addr: str, port: int, model: Any, cfg: TrainerConfig,
                 temperature: float, reward_cfg: RewardConfig | None, threads: int, gpu: int | None) -> None:
        torch.set_num_threads(threads)
        set_mmap_threshold(LEARNER_MMAP_THRESHOLD)  # this process only learns (agentrl/inference/cpu/memory.py)
        device = init_group(rank, world, port, addr, gpu)
        self.rank = rank
        self.learner = ShardedLearner(model, cfg, temperature, reward_cfg, device)
        self.sft: Any = None  # the warm start's step generator, between "sft_begin" and "sft_end"
        self.chunks: Iterator[dict[str, Tensor]] = iter(())  # a streamed push's, from "weights_begin"

    def handle(self, cmd: str, arg: Any) -> tuple[Any, int, int]:
        learner, rank = self.learner, self.rank
        if cmd == "step":
            result: Any = learner.step(arg)
        elif cmd == "weights":  # every rank takes part in each gather; rank 0 keeps the result
            result = {k: v for k, v in learner.weight_items() if rank == 0} or None
        elif cmd == "adapters":  # every rank takes part in each gather; rank 0 keeps the LoRA adapters
            adapters = learner.adapter_views()
            result = adapters if rank == 0 else None
        elif cmd == "weight_meta":
            result = learner.weight_meta() if rank == 0 else None
        elif cmd == "weights_begin":  # a streamed push: one chunk of gathered weights per "weights_next"
            self.chunks = learner.iter_weight_chunks(arg)
            result = None
        elif cmd == "weights_next":
            chunk = next(self.chunks, None)
            result = chunk if rank == 0 else None
        elif cmd == "training_state":
            state = learner.training_state()
            result = state if rank == 0 else None
        elif cmd == "load_training_state":
            result = learner.load_training_state(arg)
        elif cmd == "reset_reference":
            result = learner.reset_reference()
        elif cmd == "memory":
            result = shard_bytes(learner)
        elif cmd == "sft_begin":  # the warm start, one optimizer step per "sft_next"
            self.sft = sft_steps(learner, *arg)
            result = None
        elif cmd == "sft_next":
            result = next(self.sft, None)
        elif cmd == "sft_end":  # restores the RL learning rate, clears Adam's moments
            self.sft.close()
            result = None
        else:
            raise ValueError(f"unknown learner command {cmd!r}")
        return result, learner.version, learner.global_step

    @staticmethod
    def close() -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _worker(rank: int, world: int, port: int, conn: Any, model: Any, cfg: TrainerConfig, temperature: float,
            reward_cfg: RewardConfig | None, threads: int) -> None:
    """A spawned learner rank: answer the driver's commands until "close"."""
    gpu = rank if resolve_device(cfg.device, gpus_needed=world) == "cuda" else None  # NCCL, else gloo
    try:
        node = LearnerRank(rank, world, "127.0.0.1", port, model, cfg, temperature, reward_cfg, threads, gpu)
        conn.send(("ok", None))
        while (msg := conn.recv())[0] != "close":
            conn.send(("ok", node.handle(*msg)))
    except BaseException as e:  # the driver re-raises it in its own process
        conn.send(("error", f"learner rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        LearnerRank.close()
        conn.close()


class RayLearnerRank:
    """A learner rank as a Ray actor (one process, placed by Ray: `trainer.learner_num_gpus` GPUs
    and `trainer.learner_num_cpus` CPUs in the learners' placement group). A synchronous actor
    runs its calls one at a time in the order the driver sent them."""

    def __init__(self) -> None:
        self.node: LearnerRank | None = None

    @staticmethod
    def address() -> tuple[str, int]:
        """This node's IP and a free port on it: rank 0's are the group's rendezvous."""
        import ray  # optional: the ray extra, only for learner ranks on Ray

        return ray.util.get_node_ip_address(), free_port(host="")

    def start(self, rank: int, world: int, addr: str, port: int, model: Any, cfg: TrainerConfig,
              temperature: float, reward_cfg: RewardConfig | None) -> None:
        if isinstance(model, ModelConfig):  # resolved on the rank's own node, as the engines do
            model = resolve_configured(model)
        gpu = 0 if cfg.learner_num_gpus > 0 and torch.cuda.is_available() else None  # Ray's CUDA_VISIBLE_DEVICES
        self.node = LearnerRank(rank, world, addr, port, model, cfg, temperature, reward_cfg,
                                max(1, int(cfg.learner_num_cpus)), gpu)

    def handle(self, cmd: str, arg: Any) -> tuple[Any, int, int]:
        assert self.node is not None, "start() first"
        return self.node.handle(cmd, arg)

    def close(self) -> None:
        LearnerRank.close()


class _PipeRanks:
    """The ranks as spawned processes on this machine, each behind a pipe."""

    placement = "local"

    def __init__(self, model: str | Path, cfg: TrainerConfig, world: int, temperature: float,
                 reward_cfg: RewardConfig | None) -> None:
        ctx = mp.get_context("spawn")
        port = free_port()
        threads = max(1, torch.get_num_threads() // world)
        self.conns, self.procs = [], []
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, world, port, child, str(model), cfg, temperature,
                                                     reward_cfg, threads), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        self._gather()  # every rank has loaded and sharded its model

    def _gather(self) -> list[Any]:
        replies = []
        for rank, conn in enumerate(self.conns):
            try:
                status, payload = conn.recv()
            except EOFError:
                raise RuntimeError(f"learner rank {rank} exited (exit code {self.procs[rank].exitcode})") from None
            if status == "error":
                self.close()
                raise RuntimeError(payload)
            replies.append(payload)
        return replies

    def call(self, cmd: str, arg: Any) -> list[tuple[Any, int, int]]:
        for conn in self.conns:
            conn.send((cmd, arg))
        return self._gather()

    @property
    def alive(self) -> bool:
        return bool(self.procs)

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs):
            if proc.is_alive():
                with contextlib.suppress(BrokenPipeError, OSError):
                    conn.send(("close", None))
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        self.procs, self.conns = [], []


class _RayRanks:
    """The ranks as Ray actors in one placement group (PACK: on as few nodes as fit, all or none
    placed, as verl and SkyRL place their FSDP workers); the group meets at rank 0's node."""

    placement = "ray"

    def __init__(self, model: Any, cfg: TrainerConfig, world: int, temperature: float,
                 reward_cfg: RewardConfig | None, ready_timeout_s: float = 300.0) -> None:
        import ray  # optional: the ray extra, only for learner ranks on Ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": cfg.learner_num_cpus, **({"GPU": cfg.learner_num_gpus} if cfg.learner_num_gpus else {})}

        def no_fit(what: str) -> UserError:
            return UserError(f"trainer.num_learners={world} learners of {bundle} each {what}",
                             fix="lower trainer.num_learners or trainer.learner_num_gpus/learner_num_cpus, "
                                 "or add nodes to the cluster")

        total = ray.cluster_resources()
        if any(world * need > total.get(name, 0) for name, need in bundle.items()):
            raise no_fit(f"exceed the whole Ray cluster ({ {k: total.get(k, 0) for k in bundle} })")
        self.actors: list[Any] = []
        self.group = placement_group([bundle] * world, strategy="PACK")
        try:
            ray.get(self.group.ready(), timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.group)
            raise no_fit(f"found no room in the Ray cluster in {ready_timeout_s:.0f} s "
                         f"(free now: {ray.available_resources()})") from None
        self.actors = [
            ray.remote(RayLearnerRank).options(
                num_cpus=cfg.learner_num_cpus, num_gpus=cfg.learner_num_gpus, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=rank),
            ).remote() for rank in range(world)]
        [(addr, port)] = self._get([self.actors[0].address.remote()])  # a failure here also frees the group
        self._get([a.start.remote(rank, world, addr, port, model, cfg, temperature, reward_cfg)
                   for rank, a in enumerate(self.actors)])

    def _get(self, refs: list[Any]) -> list[Any]:
        import ray  # optional: the ray extra, only for learner ranks on Ray

        try:
            return ray.get(refs)
        except ray.exceptions.RayError as e:  # a rank raised or died: the group cannot go on
            self.close()
            raise RuntimeError(f"learner rank failed: {e}") from None

    def call(self, cmd: str, arg: Any) -> list[tuple[Any, int, int]]:
        import ray  # optional: the ray extra, only for learner ranks on Ray

        ref = ray.put(arg)  # one copy in the object store for all ranks
        return self._get([a.handle.remote(cmd, ref) for a in self.actors])

    @property
    def alive(self) -> bool:
        return bool(self.actors)

    def close(self) -> None:
        import ray  # optional: the ray extra, only for learner ranks on Ray
        from ray.util.placement_group import remove_placement_group

        if not self.actors or not ray.is_initialized():
            self.actors = []
            return
        with contextlib.suppress(Exception):
            ray.get([a.close.remote() for a in self.actors], timeout=30)
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        with contextlib.suppress(Exception):
            remove_placement_group(self.group)
        self.actors = []


class DistributedLearner:
    """Driver-side facade over `num_learners` ShardedLearner ranks: spawned processes on this
    machine (loopback group), or with `ray=True` Ray actors placed on the cluster's nodes (a Ray
    runtime must be up). Exposes the `Learner` methods the training loop and checkpoints call."""

    def __init__(self, model: Any, cfg: TrainerConfig, num_learners: int, temperature: float = 1.0,
                 reward_cfg: RewardConfig | None = None, ray: bool = False) -> None:
        if isinstance(model, torch.nn.Module):
            raise TypeError("DistributedLearner takes a model path (each rank loads its own copy)")
        self.cfg, self.temperature, self.reward_cfg = cfg, temperature, reward_cfg
        self.world = num_learners
        self.version = 0
        self.global_step = 0
        self._ranks: _PipeRanks | _RayRanks | None = None  # stays None for __del__ if starting them fails
        self._ranks = (_RayRanks if ray else _PipeRanks)(model, cfg, num_learners, temperature, reward_cfg)
        self.placement = self._ranks.placement
        # each rank's device: Ray places GPUs by trainer.learner_num_gpus, a local run by trainer.device
        self.device = (("cuda" if cfg.learner_num_gpus > 0 else "cpu") if ray
                       else resolve_device(cfg.device, gpus_needed=num_learners))
        atexit.register(self.close)  # no rank outlives the driver

    def _call(self, cmd: str, arg: Any = None) -> Any:
        if self._ranks is None or not self._ranks.alive:
            raise RuntimeError("the learner ranks are closed")
        result, self.version, self.global_step = self._ranks.call(cmd, arg)[0]
        return result

    def step(self, groups: list[Any]) -> dict[str, float]:
        return self._call("step", groups)

    def state_dict_for_inference(self) -> dict[str, Tensor]:
        return self._call("weights")

    state_dict_views = state_dict_for_inference

    def adapter_views(self) -> dict[str, Tensor]:
        return self._call("adapters")

    def weight_meta(self) -> list[tuple[str, tuple[int, ...], str, str | None]]:
        return self._call("weight_meta")

    def iter_weight_chunks(self, max_bytes: int = 64 << 20) -> Iterator[dict[str, Tensor]]:
        """The weights in parts of at most `max_bytes` (a larger tensor is a part of its own),
        gathered on the ranks one part at a time: neither rank 0 nor this driver ever holds a
        full copy (a streamed push, `RelayChain.push_stream`). A new call starts a new pass."""
        self._call("weights_begin", max_bytes)
        while (chunk := self._call("weights_next")) is not None:
            yield chunk

    def training_state(self) -> dict[str, Any]:
        return self._call("training_state")

    def load_training_state(self, state: dict[str, Any]) -> None:
        self._call("load_training_state", state)

    def reset_reference(self) -> None:
        self._call("reset_reference")

    def sft_steps(self, batch: TrainBatch, ws: WarmStartConfig, micro_batch_size: int | None = None
                  ) -> Iterator[dict[str, Any]]:
        """`agentrl.trainer.sft.sft_steps` on every rank, one optimizer step per item (rank 0's metrics);
        closing it early ends the warm start on the ranks as closing the local one does."""
        self._call("sft_begin", (batch, ws, micro_batch_size))
        try:
            while (row := self._call("sft_next")) is not None:
                yield row
        finally:
            if self._ranks is not None and self._ranks.alive:  # not after a rank's error (it closed them)
                self._call("sft_end")

    def shard_bytes(self) -> list[dict[str, int]]:
        """Per rank: bytes of its weight and optimizer shards."""
        assert self._ranks is not None
        return [payload[0] for payload in self._ranks.call("memory", None)]

    def close(self) -> None:
        if self._ranks is not None:
            self._ranks.close()

    def __del__(self) -> None:
        if getattr(self, "_ranks", None) is not None:
            with contextlib.suppress(Exception):  # at interpreter exit imports fail; atexit closed them
                self.close()


def make_learner(model: str | Path, cfg: TrainerConfig, temperature: float = 1.0,
                 reward_cfg: RewardConfig | None = None, ray_model: Any = None) -> Learner | DistributedLearner:
    """The learner `trainer.num_learners` asks for: in-process for 1, else N sharded ranks —
    spawned here, or with `ray_model` (the `ModelConfig` each rank resolves on its own node; a Ray
    runtime is up) Ray actors placed on the cluster."""
    if cfg.num_learners > 1:
        return DistributedLearner(model if ray_model is None else ray_model, cfg, cfg.num_learners, temperature,
                                  reward_cfg, ray=ray_model is not None)
    return Learner(model, cfg, temperature=temperature, reward_cfg=reward_cfg, device=resolve_device(cfg.device))
