"""Data-parallel, sharded learner (issue 16): `trainer.num_learners=N` runs N learner processes in
one torch.distributed group (gloo on CPU, NCCL on GPU) with FSDP2 `fully_shard` on every decoder
layer and on the root, so each rank holds 1/N of the weights, gradients and Adam state.

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

from agentrl.config import RewardConfig, TrainerConfig, WarmStartConfig
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.learner import Learner
from agentrl.trainer.logprobs import TokenStats, token_logprobs_and_stats


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


class ShardedLearner(Learner):
    """A `Learner` whose model is FSDP2-sharded over the default process group."""

    def __init__(self, model: str | Path | torch.nn.Module, cfg: TrainerConfig, temperature: float = 1.0,
                 reward_cfg: RewardConfig | None = None, device: str = "cpu") -> None:
        from torch.distributed.fsdp import fully_shard

        super().__init__(model, cfg, temperature, reward_cfg, device)
        if self.ref_model is not None:
            raise ValueError("trainer.kl_coef > 0 with trainer.num_learners > 1 is not supported yet; set kl_coef=0")
        for layer in decoder_layers(self.model):
            fully_shard(layer)
        self.policy = PolicyForward(self.model)
        fully_shard(self.policy)
        # The optimizer must hold the sharded (DTensor) parameters, so it is built again.
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.scheduler.lr_lambdas[0])
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def _forward(self, model: torch.nn.Module, mb: TrainBatch, entropy: bool, sum_pi_sq: bool) -> TokenStats:
        if model is not self.model:
            return super()._forward(model, mb, entropy, sum_pi_sq)
        self.policy.train(model.training)
        with self._autocast():
            lp, ent, sq = self.policy(mb.input_ids.to(self.device), mb.attention_mask.to(self.device),
                                      self.temperature, mb.loss_mask.to(self.device), entropy, sum_pi_sq)
        return TokenStats(logprobs=lp, entropy=ent, sum_pi_sq=sq)

    def weight_items(self) -> Iterator[tuple[str, Tensor]]:
        for k, v in self.model.state_dict().items():
            full = v.full_tensor() if hasattr(v, "full_tensor") else v  # all-gather of one tensor
            yield k, full.detach().to("cpu")

    def training_state(self) -> dict[str, Any]:
        """Full (unsharded) model and optimizer state, as a single learner's: a checkpoint from
        N ranks resumes on any number of ranks."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # The gathered tensors are new, but unsharded entries (Adam's `step` counts) are the live
        # ones: the driver would hold tensors that keep changing (a pipe shares their memory).
        for param_state in optim_sd.get("state", {}).values():
            for k, v in param_state.items():
                if isinstance(v, Tensor) and not hasattr(v, "to_local"):
                    param_state[k] = v.clone()
        state = super().training_state()
        state.update(model=model_sd, optimizer=optim_sd)
        return state

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
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        missing = {"model", "optimizer", "scheduler", "generator", "version", "global_step"} - set(state)
        if missing:
            raise KeyError(f"training state lacks {sorted(missing)}")
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=self._named_optimizer_state(state["optimizer"]),
                       options=StateDictOptions(full_state_dict=True))
        # set_state_dict shards the tensors into new DTensors but keeps unsharded entries (Adam's
        # `step` counts) as given. The driver's state reaches every rank through a pipe that shares
        # tensor memory, so without a copy all ranks would step one shared counter (twice per step).
        for param_state in self.optimizer.state.values():
            for k, v in param_state.items():
                if isinstance(v, Tensor) and not hasattr(v, "to_local"):
                    param_state[k] = v.clone()
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        self.version, self.global_step = int(state["version"]), int(state["global_step"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_group(rank: int, world: int, port: int) -> None:
    """Join the learners' group on loopback: NCCL where every rank has a GPU, else gloo."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)


def _worker(rank: int, world: int, port: int, conn: Any, model: Any, cfg: TrainerConfig, temperature: float,
            reward_cfg: RewardConfig | None, threads: int) -> None:
    """One learner rank: answer the driver's commands until "close"; rank 0 replies with data."""
    torch.set_num_threads(threads)
    init_group(rank, world, port)
    device = f"cuda:{rank}" if dist.get_backend() == "nccl" else "cpu"
    try:
        learner = ShardedLearner(model, cfg, temperature, reward_cfg, device)
        sft: Any = None  # the warm start's step generator, between "sft_begin" and "sft_end"
        conn.send(("ok", None))
        while True:
            cmd, arg = conn.recv()
            if cmd == "close":
                break
            if cmd == "step":
                result: Any = learner.step(arg)
            elif cmd == "weights":  # every rank takes part in each gather; rank 0 keeps the result
                result = {k: v for k, v in learner.weight_items() if rank == 0} or None
            elif cmd == "training_state":
                state = learner.training_state()
                result = state if rank == 0 else None
            elif cmd == "load_training_state":
                result = learner.load_training_state(arg)
            elif cmd == "memory":
                result = shard_bytes(learner)
            elif cmd == "sft_begin":  # the warm start, one optimizer step per "sft_next"
                from agentrl.sft import sft_steps

                sft = sft_steps(learner, *arg)
                result = None
            elif cmd == "sft_next":
                result = next(sft, None)
            elif cmd == "sft_end":  # restores the RL learning rate, clears Adam's moments
                sft.close()
                result = None
            else:
                raise ValueError(f"unknown learner command {cmd!r}")
            conn.send(("ok", (result, learner.version, learner.global_step)))
    except BaseException as e:  # the driver re-raises it in its own process
        conn.send(("error", f"learner rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        dist.destroy_process_group()
        conn.close()


def shard_bytes(learner: Learner) -> dict[str, int]:
    """Bytes this rank holds for weights and the optimizer state (local shards only)."""
    def local(t: Tensor) -> Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    weights = sum(local(p).numel() * local(p).element_size() for p in learner.model.parameters())
    optim = sum(local(v).numel() * local(v).element_size() for s in learner.optimizer.state.values()
                for v in s.values() if isinstance(v, Tensor) and v.dim() > 0)
    return {"weights": weights, "optimizer": optim}


class DistributedLearner:
    """Driver-side facade over `num_learners` ShardedLearner processes (spawned, loopback group).
    Exposes the `Learner` methods the training loop and checkpoints call."""

    def __init__(self, model: str | Path, cfg: TrainerConfig, num_learners: int, temperature: float = 1.0,
                 reward_cfg: RewardConfig | None = None) -> None:
        if isinstance(model, torch.nn.Module):
            raise TypeError("DistributedLearner takes a model path (each rank loads its own copy)")
        self.cfg, self.temperature, self.reward_cfg = cfg, temperature, reward_cfg
        self.world = num_learners
        self.version = 0
        self.global_step = 0
        ctx = mp.get_context("spawn")
        port = free_port()
        threads = max(1, torch.get_num_threads() // num_learners)
        self._conns, self._procs = [], []
        for rank in range(num_learners):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, num_learners, port, child, str(model), cfg, temperature,
                                                     reward_cfg, threads), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        atexit.register(self.close)  # no rank outlives the driver
        self._gather()  # every rank has loaded and sharded its model

    def _gather(self) -> list[Any]:
        replies = []
        for rank, conn in enumerate(self._conns):
            try:
                status, payload = conn.recv()
            except EOFError:
                raise RuntimeError(f"learner rank {rank} exited (exit code {self._procs[rank].exitcode})") from None
            if status == "error":
                self.close()
                raise RuntimeError(payload)
            replies.append(payload)
        return replies

    def _call(self, cmd: str, arg: Any = None) -> Any:
        for conn in self._conns:
            conn.send((cmd, arg))
        result, self.version, self.global_step = self._gather()[0]
        return result

    def step(self, groups: list[Any]) -> dict[str, float]:
        return self._call("step", groups)

    def state_dict_for_inference(self) -> dict[str, Tensor]:
        return self._call("weights")

    state_dict_views = state_dict_for_inference

    def training_state(self) -> dict[str, Any]:
        return self._call("training_state")

    def load_training_state(self, state: dict[str, Any]) -> None:
        self._call("load_training_state", state)

    def sft_steps(self, batch: TrainBatch, ws: WarmStartConfig, micro_batch_size: int | None = None
                  ) -> Iterator[dict[str, Any]]:
        """`agentrl.sft.sft_steps` on every rank, one optimizer step per item (rank 0's metrics);
        closing it early ends the warm start on the ranks as closing the local one does."""
        self._call("sft_begin", (batch, ws, micro_batch_size))
        try:
            while (row := self._call("sft_next")) is not None:
                yield row
        finally:
            if self._procs:  # not after a rank's error (close() already ran)
                self._call("sft_end")

    def shard_bytes(self) -> list[dict[str, int]]:
        """Per rank: bytes of its weight and optimizer shards."""
        for conn in self._conns:
            conn.send(("memory", None))
        return [payload[0] for payload in self._gather()]

    def close(self) -> None:
        for conn, proc in zip(self._conns, self._procs):
            if proc.is_alive():
                with contextlib.suppress(BrokenPipeError, OSError):
                    conn.send(("close", None))
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        self._procs, self._conns = [], []

    def __del__(self) -> None:
        if getattr(self, "_procs", None):
            self.close()


def make_learner(model: str | Path, cfg: TrainerConfig, temperature: float = 1.0,
                 reward_cfg: RewardConfig | None = None) -> Learner | DistributedLearner:
    """The learner `trainer.num_learners` asks for: in-process for 1, else N sharded ranks."""
    if cfg.num_learners > 1:
        return DistributedLearner(model, cfg, cfg.num_learners, temperature, reward_cfg)
    return Learner(model, cfg, temperature=temperature, reward_cfg=reward_cfg)
