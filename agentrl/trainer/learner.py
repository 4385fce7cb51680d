"""The learner: owns the policy model and its optimizer; turns groups of trajectories into an
update (architecture.md §8; composition order of algorithms.md §9).

One `step(groups)` is one global batch:

1. rewards: with a `RewardConfig`, each trajectory's scalar `reward` is recomputed here from
   `outcome_reward` and `step_rewards` (G-RA gate, §3) plus DAPO soft overlong shaping on its
   policy-token count (§5.2(4)); without one, `trajectory.reward` is used as given;
2. DAPO dynamic sampling filter (drop zero-variance groups, §5.2(2)) when enabled;
3. advantages over rollouts (GRPO / Dr.GRPO / RLOO, SUPO broadcast to segments, §4.2);
4. π_old = π_prox recomputed at the sampling temperature without gradient (§2.4 step 1, §8.2);
   OTB advantages from the same pass (§6). Skipped when it would equal the training forward's
   detached log-probs (one mini-batch, no OTB, TRM off, no dropout): then π_prox := logp.detach()
   of the training pass itself, and the metrics that read π_old are taken from that pass;
5. TRM sequence mask from log ρ = log π_old − log π_roll, frozen for the batch (§2.4 steps 2–4);
6. `minibatches` optimizer steps, each over micro-batches with gradient accumulation; the loss
   divisors are whole-mini-batch counts so accumulation equals one big batch; grad clipping.

Trajectories with status error/aborted are dropped (no reward to trust); overlong ones stay in
their group's statistics with loss mask 0 (SUPO §4.2).

Memory: activation checkpointing per decoder layer (`trainer.activation_checkpointing`), an
optional bf16 autocast forward (`trainer.dtype`; fp32 master weights and LM head), Adam moments in
fp32 or 8 bits (`trainer.optimizer`), and weight views for the push (`state_dict_views`) instead of
a second copy.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from agentrl.config import LoRAConfig, RewardConfig, TrainerConfig
from agentrl.inference.cpu.memory import bound_kernel_caches
from agentrl.models import autocast_dtype, load_model, resolve_model
from agentrl.phases import track
from agentrl.trainer.advantages import otb_advantages, supo_advantages
from agentrl.trainer.batch import TrainBatch, build_batch, micro_batches
from agentrl.trainer.logprobs import TokenStats, token_logprobs_and_stats
from agentrl.trainer.losses import (
    Denominators,
    aggregate_loss,
    behaviour_weights,
    decoupled_ppo_loss,
    denominators,
    gspo_token_loss,
    k3,
    k3_kl,
    masked_mean,
    ppo_clip_loss,
    reinforce_loss,
    safe_ratio,
    sft_loss,
    trm_sequence_mask,
)
from agentrl.trainer.rewards import filter_groups, g_ra, overlong_penalty
from agentrl.types import Group, Trajectory


def _load(model: str | Path | torch.nn.Module, device: str) -> torch.nn.Module:
    if isinstance(model, torch.nn.Module):
        return model.float().to(device)
    return load_model(resolve_model(str(model)), dtype="float32", device=device)


_DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop")


def _quiet_bitsandbytes() -> None:
    """bitsandbytes' CPU backend (imported by it and by peft) warns at import that an optional
    4-bit GEMM kernel package is missing; 4-bit GEMMs are not used here."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def inject_lora(model: torch.nn.Module, lora: LoRAConfig, seed: int = 0) -> None:
    """Add peft LoRA adapters to `model` in place (the base weights are frozen). Their random
    initial A matrices come from `seed`, not the global RNG: every learner rank (FSDP2 keeps each
    rank's own slice of them) and a rerun start from the same adapters."""
    _quiet_bitsandbytes()
    from peft import LoraConfig, get_peft_model  # after the quieting: peft imports bitsandbytes

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.targets),
                                         lora_dropout=0.0))


def hf_name(key: str) -> str:
    """A state-dict key under the base model's (HF) name: peft's `X.base_layer.weight` is `X.weight`."""
    return key.replace(".base_layer.", ".")


def hf_weight_items(model: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(HF name, detached CPU tensor) of `model`'s weights; LoRA adapters are merged into their base
    weights (what engines load), otherwise the tensors are views of the live parameters."""
    for k, v in model.state_dict().items():
        if ".lora_" in k:
            continue
        if ".base_layer." in k and k.endswith(".weight"):
            with torch.no_grad():
                v = v + model.get_submodule(k.split(".base_layer.")[0]).get_delta_weight("default")
        yield hf_name(k), v.detach().to("cpu")


def peft_adapter_name(key: str) -> str:
    """A LoRA state-dict key as `PeftModel.save_pretrained` writes it (what vLLM's LoRA loader reads):
    `model.layers.0.self_attn.q_proj.lora_A.default.weight` -> `base_model.model.model.layers.0.
    self_attn.q_proj.lora_A.weight` (the adapters are injected into the bare model in place)."""
    return "base_model.model." + key.replace(".default.", ".")


def adapter_items(model: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(peft name, tensor as the model holds it: a shard under FSDP2) of each LoRA adapter of
    `model`: the push to an engine that applies adapters itself (vLLM), a few MB instead of the
    merged weights."""
    for k, v in model.state_dict().items():
        if ".lora_" in k:
            yield peft_adapter_name(k), v


def merged_lora_weights(model_path: str | Path, lora: LoRAConfig, adapter: dict[str, Tensor]) -> dict[str, Tensor]:
    """The base model's weights with a checkpoint's adapter (`training_state()["model"]` of a LoRA
    learner) merged in, under the HF names: what `agentrl eval --checkpoint` gives an engine."""
    model = _load(model_path, "cpu")
    inject_lora(model, lora)
    _, unexpected = model.load_state_dict(adapter, strict=False)
    if unexpected:
        raise KeyError(f"checkpoint adapter does not match trainer.lora: unexpected {unexpected[:3]}")
    return dict(hf_weight_items(model))


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Checkpoint each decoder layer of a transformers model (no-op for other modules); non-reentrant
    works with inputs that need no grad and with FSDP2. transformers >= 5.23 renamed the method."""
    kwargs = {"use_reentrant": False}
    if getattr(model, "config", None) is not None:
        model.config.use_cache = False  # training forwards keep no KV cache (and transformers says so otherwise)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def demonstrations_on_policy(behaviour: Tensor, prox: Tensor, demonstrated: Tensor) -> None:
    """An expert's rows (agentrl/guidance.py) have no behaviour log-probs: the teacher emitted
    their tokens. Treat them as sampled by π_prox (in place): the IS weight π_prox/π_behav is 1, TRM
    accepts them, and the clipped objective's gradient at ratio 1 is A·∇log π per token."""
    if demonstrated.any():
        behaviour[demonstrated] = prox[demonstrated]


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether a train-mode forward is random (then it cannot stand in for the eval-mode π_prox)."""
    config = getattr(model, "config", None)
    if any(float(getattr(config, k, 0.0) or 0.0) > 0 for k in _DROPOUT_KEYS):
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def make_optimizer(params: list[torch.nn.Parameter], cfg: TrainerConfig) -> torch.optim.Optimizer:
    """`trainer.optimizer`: torch's AdamW (fp32 moments), or bitsandbytes' AdamW8bit, whose moments
    are stored as 8-bit codes with an fp32 scale per block of 256 (Dettmers et al., 2022), about a
    quarter of the bytes, with the same update rule. Runs on CPU and CUDA tensors.

    torch's AdamW is its fused kernel where every parameter is a plain CPU or CUDA tensor: one pass
    per tensor instead of a dozen, 2.1 s against 7.4-9.5 s for the 135M model's step on this 2-core
    CPU (docs/benchmarks.md, Memory); FSDP2's sharded (DTensor) parameters keep the default.

    `auto` is AdamW8bit for one learner process and AdamW for FSDP2's shards, whose DTensors
    bitsandbytes' whole-tensor 8-bit state cannot hold."""
    sharded = any(hasattr(p, "to_local") for p in params)
    if cfg.optimizer == "adamw8bit" or (cfg.optimizer == "auto" and not sharded):
        _quiet_bitsandbytes()
        import bitsandbytes as bnb  # after the quieting, which must precede its import

        return bnb.optim.AdamW8bit(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    fused = all(type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") and p.is_floating_point()
                for p in params)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                             fused=fused or None)


def warmup_constant(warmup_steps: int):
    """LR multiplier: linear warm-up over `warmup_steps` optimizer steps, then constant."""
    return lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


class Learner:
    """Policy model (HF causal LM, fp32) + AdamW (fp32 or 8-bit moments) + warm-up/constant LR schedule."""

    def __init__(self, model: str | Path | torch.nn.Module, cfg: TrainerConfig, temperature: float = 1.0,
                 reward_cfg: RewardConfig | None = None, device: str = "cpu") -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if cfg.minibatches < 1 or cfg.micro_batch_size < 1 or cfg.micro_batch_tokens < 0:
            raise ValueError(f"trainer.minibatches and trainer.micro_batch_size must be >= 1 and "
                             f"trainer.micro_batch_tokens >= 0, got {cfg.minibatches}, {cfg.micro_batch_size} "
                             f"and {cfg.micro_batch_tokens}")
        self.cfg, self.temperature, self.reward_cfg, self.device = cfg, temperature, reward_cfg, device
        if torch.device(device).type == "cpu":
            bound_kernel_caches()  # before this process's first bf16 kernel (inference/cpu/memory.py)
        self.dtype = autocast_dtype(cfg.dtype, device)  # the forward's autocast dtype ("auto" resolved)
        self.model = _load(model, device)
        self.lora = cfg.lora.rank > 0
        if self.lora:  # adapters injected in place; the base weights are frozen
            inject_lora(self.model, cfg.lora, cfg.seed)
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(self.model)
        self.model.train()
        # A frozen copy of the initial policy, only when the k3 KL penalty needs it (§8.1).
        self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(params, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_constant(cfg.warmup_steps))
        self.generator = torch.Generator().manual_seed(cfg.seed)  # mini-batch shuffling
        self.rank, self.world = 0, 1  # data-parallel position; distributed.shard_learner sets them
        self.version = 0  # global batches trained = weight version pushed to engines
        self.global_step = 0  # optimizer steps
        self.replay: TrainBatch | None = None  # warm-start sequences replayed in RL (set_replay)
        track("learner_weights", self, lambda lr: lr.model.parameters())  # bench/memory.py's phase marks
        track("gradients", self, lambda lr: (p.grad for p in lr.model.parameters()))
        track("optimizer", self, lambda lr: (t for st in list(lr.optimizer.state.values()) for t in st.values()
                                             if isinstance(t, torch.Tensor)))
        if self.ref_model is not None:
            track("reference_model", self, lambda lr: lr.ref_model.parameters())

    # ------------------------------------------------------------------ rewards / advantages

    def trajectory_reward(self, traj: Trajectory) -> float:
        """§9 step 2: outcome + step rewards through the G-RA gate, then overlong shaping."""
        assert self.reward_cfg is not None
        reward = g_ra(traj.outcome_reward, traj.step_rewards, self.reward_cfg.gate)
        ov = self.cfg.overlong
        if ov.enabled:
            reward += overlong_penalty(traj.num_policy_tokens, ov.max_len, ov.cache_len, ov.penalty_factor)
        return reward

    def _prepare(self, groups: list[Group]) -> tuple[TrainBatch, dict[str, float]]:
        metrics: dict[str, float] = {}
        trainable = [Group(g.id, g.task_id, [t for t in g.trajectories if t.status.trainable]) for g in groups]
        metrics["dropped_error_trajectories"] = float(sum(len(g.trajectories) for g in groups)
                                                      - sum(len(g.trajectories) for g in trainable))
        if self.reward_cfg is not None:
            for g in trainable:
                for t in g.trajectories:
                    t.reward = self.trajectory_reward(t)
        kept = [g for g in trainable if g.trajectories]
        if self.cfg.dynamic_sampling:
            kept = filter_groups(kept, lambda g: g.rewards)
        metrics["dropped_zero_variance_groups"] = float(len([g for g in trainable if g.trajectories]) - len(kept))
        trajs = [t for g in kept for t in g.trajectories]
        gidx = torch.tensor([i for i, g in enumerate(kept) for _ in g.trajectories], dtype=torch.long)
        rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float)
        if self.cfg.advantage == "otb" or not trajs:  # OTB needs π_old first (step 4)
            adv = torch.zeros(len(trajs))
        else:
            overlong = torch.tensor([t.overlong for t in trajs], dtype=torch.bool)
            adv = supo_advantages(rewards, gidx, overlong, estimator=self.cfg.advantage)
        if trajs:
            metrics.update(reward_mean=rewards.mean().item(), reward_std=rewards.std().item() if len(trajs) > 1 else 0.0,
                           outcome_reward_mean=sum(t.outcome_reward for t in trajs) / len(trajs))
        return build_batch(trajs, adv, gidx), metrics

    # ------------------------------------------------------------------ forward passes

    def _micro_batches(self, batch: TrainBatch) -> list[Tensor]:
        lengths = batch.attention_mask.sum(-1).tolist()
        return micro_batches(lengths, self.cfg.micro_batch_size, self.cfg.micro_batch_tokens)

    @staticmethod
    def _trim(batch: TrainBatch) -> TrainBatch:
        """Drop all-padding columns on the right (rows are right-padded)."""
        width = max(int(batch.attention_mask.sum(-1).max()), 2)
        return TrainBatch(**{k: (v[:, :width] if v.dim() == 2 else v) for k, v in vars(batch).items()})

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(torch.device(self.device).type, dtype=getattr(torch, self.dtype))

    def _forward(self, model: torch.nn.Module, mb: TrainBatch, entropy: bool, sum_pi_sq: bool,
                 temperature: float | None = None) -> TokenStats:
        """Log-probs (and stats) of the loss-masked tokens at `temperature` (default: the sampling one)."""
        with self._autocast():
            return token_logprobs_and_stats(model, mb.input_ids.to(self.device), mb.attention_mask.to(self.device),
                                            temperature or self.temperature, positions=mb.loss_mask.to(self.device),
                                            entropy=entropy, sum_pi_sq=sum_pi_sq)

    def prox_from_training_forward(self, n_rows: int) -> bool:
        """True when the π_prox recompute would equal the training forward's detached log-probs:
        one optimizer step per batch (weights unchanged before every forward), no OTB (which needs
        π_old before any loss), TRM off (its mask needs π_old first) and a deterministic forward."""
        cfg = self.cfg
        return (min(cfg.minibatches, n_rows) == 1 and cfg.advantage != "otb" and cfg.trm.mode == "off"
                and not has_dropout(self.model))

    @torch.no_grad()
    def _recompute(self, model: torch.nn.Module, batch: TrainBatch, entropy: bool = False,
                   sum_pi_sq: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(log π, entropy, Σπ²) for every row, micro-batched, no gradient; the last two only when
        asked for (else None)."""
        shape = batch.input_ids.shape
        out = [torch.zeros(shape) if want else None for want in (True, entropy, sum_pi_sq)]
        was_training = model.training
        model.eval()
        for rows in self._micro_batches(batch):
            mb = self._trim(batch.select(rows))
            stats = self._forward(model, mb, entropy, sum_pi_sq)
            w = mb.input_ids.shape[1]
            for o, x in zip(out, (stats.logprobs, stats.entropy, stats.sum_pi_sq)):
                if o is not None and x is not None:
                    o[rows, :w] = x.cpu()
        model.train(was_training)
        return out[0], out[1], out[2]

    # ------------------------------------------------------------------ loss

    def _token_loss(self, logp: Tensor, old: Tensor, behav: Tensor, adv: Tensor, mask: Tensor
                    ) -> tuple[Tensor, Tensor]:
        """Per-token loss and clipped mask for the configured objective (§2.4 5, §8.2–8.4)."""
        cfg = self.cfg
        prox = old if cfg.decoupled else behav  # bypass mode: π_old := π_roll, no IS weight (§8.3)
        if cfg.loss == "ppo":
            if cfg.decoupled:
                return decoupled_ppo_loss(logp, prox, behav, adv, cfg.clip_low, cfg.clip_high, cfg.dual_clip,
                                          cfg.tis_cap)
            return ppo_clip_loss(safe_ratio(logp - prox), adv, cfg.clip_low, cfg.clip_high, cfg.dual_clip)
        if cfg.loss == "gspo":
            loss, clipped = gspo_token_loss(logp, prox, adv, mask, cfg.gspo_clip_low, cfg.gspo_clip_high)
            if cfg.decoupled:
                loss = behaviour_weights(prox, behav, cfg.tis_cap) * loss
            return loss, clipped
        if cfg.loss == "reinforce":
            return reinforce_loss(logp, behav, adv, cfg.tis_cap), torch.zeros_like(logp)
        raise ValueError(f"unknown trainer.loss {cfg.loss!r}; choose ppo, gspo or reinforce")

    @staticmethod
    def _ppl_gap(old: Tensor, behav: Tensor, mask: Tensor) -> float:
        """Log-Abs-PPL gap Δ_PPL = mean_i |mean_t log π_old − mean_t log π_roll| (TRM, §2.4)."""
        rows = mask.sum(-1) > 0
        n = mask.sum(-1).clamp(min=1)
        gap = (((old - behav) * mask).sum(-1) / n).abs()
        return gap[rows].mean().item() if rows.any() else 0.0

    def _loss_scale(self, norm_mask: Tensor) -> float:
        """Dr.GRPO divisor for one mini-batch: (1/#seqs) Σ_i (1/L) Σ_t ℓ, with the constant L =
        trainer.loss_scale_factor, else the batch's padded length (§8.1)."""
        length = self.cfg.loss_scale_factor or float(norm_mask.shape[-1])
        return max(float((norm_mask.sum(-1) > 0).sum()), 1.0) * length

    # ------------------------------------------------------------------ one global batch

    def nothing_to_learn(self, batch: TrainBatch) -> bool:
        """All advantages 0 (each group's rewards equal) and no KL term: the loss is constant."""
        return (self.cfg.advantage != "otb" and self.cfg.kl_coef == 0
                and not bool(batch.advantages.abs().gt(0).any()))

    def step(self, groups: list[Group]) -> dict[str, float]:
        """Train on one global batch of whole groups; returns metrics. Increments `version`
        unless nothing in the batch was trainable (then the weights are unchanged)."""
        t0 = time.perf_counter()
        cfg = self.cfg
        batch, metrics = self._prepare(groups)
        metrics.update(version=float(self.version), lr=self.scheduler.get_last_lr()[0])
        if len(batch) == 0:
            return {**metrics, "skipped": 1.0, "num_rows": 0.0, "loss": 0.0}
        if self.nothing_to_learn(batch):
            # every group had equal rewards and no KL term pulls: the gradient is exactly 0, and an
            # Adam step on it would still move the weights along its momentum (a step nobody asked for)
            return {**metrics, "skipped": 1.0, "num_rows": float(len(batch)), "adv_abs_mean": 0.0, "loss": 0.0}

        # π_old / π_prox at the sampling temperature, frozen for every mini-batch (§2.4, §8.2);
        # in the lean case filled from the training forward below instead.
        lean = self.prox_from_training_forward(len(batch))
        want_entropy = cfg.entropy_every > 0 and self.version % cfg.entropy_every == 0
        old_entropy: Tensor | None
        if lean:
            old = torch.zeros(batch.input_ids.shape)
            old_entropy = torch.zeros(batch.input_ids.shape) if want_entropy else None
        else:
            old, old_entropy, sum_pi_sq = self._recompute(self.model, batch, entropy=want_entropy,
                                                          sum_pi_sq=cfg.advantage == "otb")
            demonstrations_on_policy(batch.behaviour_logprobs, old, batch.demonstrated)
        mask = batch.loss_mask
        if cfg.advantage == "otb":
            assert sum_pi_sq is not None
            is_w = (behaviour_weights(old, batch.behaviour_logprobs, cfg.tis_cap)
                    if cfg.decoupled and cfg.tis_cap is not None else None)
            batch.advantages, _ = otb_advantages(batch.token_rewards, mask, batch.group_index, old, sum_pi_sq,
                                                 is_weights=is_w, zero_tail=cfg.otb_zero_tail)
        ref = self._recompute(self.ref_model, batch)[0] if self.ref_model is not None else None

        # TRM (§2.3), sample-based on the sampled token's log ρ: only log-probs are stored.
        accept = trm_sequence_mask(mask, cfg.trm.mode, cfg.trm.delta, cfg.trm.delta_avg,
                                   log_ratio=(old - batch.behaviour_logprobs) * mask)
        train_mask = mask * accept.unsqueeze(-1).float()
        norm_mask = mask if cfg.trm.normalize == "total" else train_mask
        has_tokens = mask.sum(-1) > 0
        metrics.update(
            trm_masked_fraction=1.0 - accept[has_tokens].float().mean().item(),
            adv_mean=masked_mean(batch.advantages, mask).item(),
            adv_abs_mean=masked_mean(batch.advantages.abs(), mask).item(),
            adv_min=batch.advantages[mask.bool()].min().item(), adv_max=batch.advantages[mask.bool()].max().item(),
            num_rows=float(len(batch)), num_tokens=float(batch.num_tokens), num_policy_tokens=mask.sum().item())

        # Mini-batches: a seeded shuffle of rows, then optimizer steps with accumulation.
        order = torch.randperm(len(batch), generator=self.generator)
        sums = dict(loss=0.0, pg_loss=0.0, kl_loss=0.0, clipped=0.0, entropy=0.0, grad_norm=0.0, replay_loss=0.0)
        n_updates = 0
        for rows in order.tensor_split(min(cfg.minibatches, len(batch))):
            mb = batch.select(rows)
            mb_old, mb_norm, mb_train = old[rows], norm_mask[rows], train_mask[rows]
            mb_ref = ref[rows] if ref is not None else None
            denom = denominators(mb_norm, cfg.loss_agg, self._loss_scale(mb_norm))
            mb_ent = torch.zeros(mb_old.shape) if want_entropy else None
            stats = self._minibatch(mb, mb_old, mb_train, mb_norm, mb_ref, denom, lean, mb_ent)
            if self.replay is not None:
                stats["replay_loss"] = self.replay_backward()
            if lean:  # the pass's detached log-probs were π_prox: keep them for the metrics
                old[rows] = mb_old
                if old_entropy is not None and mb_ent is not None:
                    old_entropy[rows] = mb_ent
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            if hasattr(grad_norm, "full_tensor"):  # sharded (FSDP2) parameters: a DTensor norm
                grad_norm = grad_norm.full_tensor()
            if not torch.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError(f"non-finite gradient norm {grad_norm.item()} at step {self.global_step}")
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.global_step += 1
            n_updates += 1
            for k, v in stats.items():
                sums[k] += v
            sums["grad_norm"] += grad_norm.item()
        n_train = max(train_mask.sum().item(), 1.0)
        if lean:  # as each pass did for its own rows (the off-policy metrics below then read 0 for them)
            demonstrations_on_policy(batch.behaviour_logprobs, old, batch.demonstrated)
        log_rho = (old - batch.behaviour_logprobs) * mask
        metrics.update(
            kl_k3_old_roll=masked_mean(k3(log_rho), mask).item(),
            mean_abs_log_rho=masked_mean(log_rho.abs(), mask).item(),
            max_abs_log_rho=log_rho.abs().max().item(),
            log_abs_ppl_gap=self._ppl_gap(old, batch.behaviour_logprobs, mask),
            prox_recomputed=float(not lean))
        if old_entropy is not None:
            metrics.update(entropy_old=masked_mean(old_entropy, mask).item(), entropy=sums["entropy"] / n_train)
        self.version += 1
        elapsed = time.perf_counter() - t0
        metrics.update(loss=sums["loss"] / n_updates, pg_loss=sums["pg_loss"] / n_updates,
                       kl_ref=sums["kl_loss"] / n_updates, clip_fraction=sums["clipped"] / n_train,
                       grad_norm=sums["grad_norm"] / n_updates,
                       optimizer_steps=float(n_updates), step_seconds=elapsed,
                       tokens_per_s=batch.num_tokens / elapsed)
        if self.replay is not None:
            metrics["replay_loss"] = sums["replay_loss"] / n_updates
        metrics["version"] = float(self.version)
        return metrics

    def set_replay(self, batch: TrainBatch | None) -> None:
        """The sequences `replay_backward` draws from (the warm start's; None or empty: no replay)."""
        self.replay = batch if batch is not None and len(batch) else None

    def replay_backward(self) -> float:
        """PPO-ptx's second term (InstructGPT, Ouyang et al. 2022, eq. 2, with the warm start's
        demonstrations as its data): γ · the SFT loss (mean NLL of the policy tokens, temperature 1)
        of `replay_rows` sequences drawn by the learner's seeded generator, accumulated into this
        update's gradient. Returns the γ-scaled loss."""
        assert self.replay is not None
        ws = self.cfg.warm_start
        rows = self.replay.select(torch.randperm(len(self.replay), generator=self.generator)[:ws.replay_rows])
        n_policy = float(rows.loss_mask.sum())
        total = 0.0
        for index in self._micro_batches(rows):
            mb = self._trim(rows.select(index))
            logp = self._forward(self.model, mb, entropy=False, sum_pi_sq=False, temperature=1.0).logprobs
            loss = ws.replay_coef * sft_loss(logp.float().cpu(), mb.loss_mask, n_policy)
            loss.backward()
            total += loss.item()
        return total

    def _minibatch(self, mb: TrainBatch, old: Tensor, train_mask: Tensor, norm_mask: Tensor,
                   ref: Tensor | None, denom: Denominators, lean: bool = False,
                   entropy_out: Tensor | None = None) -> dict[str, float]:
        """Forward/backward over the micro-batches of one mini-batch; gradients accumulate.
        `lean`: π_prox is this pass's detached log-probs, written into `old` (in place);
        `entropy_out`: the per-token entropy is computed and written there."""
        cfg = self.cfg
        out = dict(loss=0.0, pg_loss=0.0, kl_loss=0.0, clipped=0.0, entropy=0.0)
        passes = self._micro_batches(mb)
        mine = passes[self.rank::self.world]  # data parallel: this rank's micro-batches
        for i in range(-(-len(passes) // self.world)):  # as many forwards on every rank (FSDP collectives)
            real = i < len(mine)
            rows = mine[i] if real else passes[0]  # a rank with none left runs a zero-weighted one
            micro = self._trim(mb.select(rows))
            w = micro.input_ids.shape[1]
            m_train, m_norm, m_old = train_mask[rows, :w], norm_mask[rows, :w], old[rows, :w]
            if m_train.sum() == 0 and cfg.kl_coef == 0 and self.world == 1:
                continue  # contributes exactly nothing; skip the forward
            stats = self._forward(self.model, micro, entropy=entropy_out is not None, sum_pi_sq=False)
            logp = stats.logprobs.cpu() if self.device != "cpu" else stats.logprobs
            if lean:
                m_old = logp.detach()
                demonstrations_on_policy(micro.behaviour_logprobs, m_old, micro.demonstrated)
                if real:
                    old[rows, :w] = m_old
            if entropy_out is not None and stats.entropy is not None and real:
                entropy_out[rows, :w] = stats.entropy.cpu()
            per_tok, clipped = self._token_loss(logp, m_old, micro.behaviour_logprobs, micro.advantages, m_train)
            pg = aggregate_loss(per_tok, m_train, cfg.loss_agg, m_norm, denom)
            loss = pg
            if ref is not None:
                kl = aggregate_loss(k3_kl(logp, ref[rows, :w]), m_train, cfg.loss_agg, m_norm, denom)
                loss = loss + cfg.kl_coef * kl
            # FSDP averages gradients over ranks; the divisors already count the whole mini-batch.
            (loss * (self.world if real else 0.0)).backward()
            if not real:
                continue
            if ref is not None:
                out["kl_loss"] += kl.item()
            out["loss"] += loss.item()
            out["pg_loss"] += pg.item()
            out["clipped"] += (clipped * m_train).sum().item()
            if stats.entropy is not None:
                out["entropy"] += (stats.entropy.cpu() * m_train).sum().item()
        if self.world > 1:  # each rank filled its own micro-batches: sum them everywhere
            totals = self._all_reduce(torch.tensor(list(out.values()), dtype=torch.float64))
            out = dict(zip(out, totals.tolist()))
            if lean:
                old.copy_(self._all_reduce(old))
            if entropy_out is not None:
                entropy_out.copy_(self._all_reduce(entropy_out))
        return out

    def _all_reduce(self, t: Tensor) -> Tensor:
        """Sum over the learner ranks (identity for one process)."""
        if self.world > 1:
            dist.all_reduce(t)
        return t

    # ------------------------------------------------------------------ weights and state

    def weight_items(self) -> Iterator[tuple[str, Tensor]]:
        """(HF name, detached CPU tensor) one at a time: views of the live parameters on a CPU
        learner; a sharded learner gathers each in turn (a collective: every rank iterates)."""
        yield from hf_weight_items(self.model)

    def state_dict_for_inference(self) -> dict[str, Tensor]:
        """Detached CPU copies of the weights under their HF names (what engines' load_weights take)."""
        return {k: v.clone() for k, v in self.weight_items()}

    def state_dict_views(self) -> dict[str, Tensor]:
        """The weights under their HF names without a copy on a CPU learner (views of the live
        parameters): valid until the next `step`, so a caller copies them out (relay buffer,
        engine) before training goes on."""
        return dict(self.weight_items())

    def adapter_views(self) -> dict[str, Tensor]:
        """The LoRA adapters under peft's names (views, valid until the next `step`): what a vLLM
        engine loads as a LoRA adapter instead of merged weights (`laminar.loop.push_weights`)."""
        if not self.lora:
            raise ValueError("adapter_views: this learner trains no LoRA adapters (trainer.lora.rank=0)")
        return {k: v.detach().to("cpu") for k, v in adapter_items(self.model)}

    def iter_weight_chunks(self, max_bytes: int = 64 << 20) -> Iterator[dict[str, Tensor]]:
        """`state_dict_views()` in groups of at most `max_bytes` (a tensor larger than that is a
        group of its own), for pushing weights without materialising a full copy."""
        chunk: dict[str, Tensor] = {}
        size = 0
        for name, tensor in self.weight_items():
            nbytes = tensor.numel() * tensor.element_size()
            if chunk and size + nbytes > max_bytes:
                yield chunk
                chunk, size = {}, 0
            chunk[name] = tensor
            size += nbytes
        if chunk:
            yield chunk

    @torch.no_grad()
    def reset_reference(self) -> None:
        """Make the k3 KL's reference (kl_coef > 0) the policy as it is now, in place: RL after a
        warm start regularises towards the warm-started policy, not the base model it came from
        (which a warm start leaves far behind: a KL to it would pull the tool format back out)."""
        if self.ref_model is not None:
            for ref, param in zip(self.ref_model.parameters(), self.model.parameters(), strict=True):
                ref.copy_(param)

    def _own_state(self, model: torch.nn.Module) -> dict[str, Tensor]:
        """`model`'s weights as a checkpoint holds them."""
        state = model.state_dict()
        if self.lora:  # the adapter only: the base is the run's model, loaded again on resume
            state = {k: v for k, v in state.items() if ".lora_" in k}
        return state

    def _model_and_optimizer_state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        return self._own_state(self.model), self.optimizer.state_dict()

    def training_state(self) -> dict[str, Any]:
        """Everything needed to continue exactly (checkpoint.py adds global RNG states), with the
        KL's reference where there is one (after a warm start it is no longer the run's model)."""
        model, optimizer = self._model_and_optimizer_state()
        state = {"model": model, "optimizer": optimizer,
                 "scheduler": self.scheduler.state_dict(), "generator": self.generator.get_state(),
                 "version": self.version, "global_step": self.global_step}
        if self.ref_model is not None:
            state["reference"] = self._own_state(self.ref_model)
        return state

    def _load_reference(self, state: dict[str, Any]) -> None:
        if self.ref_model is not None and "reference" in state:
            self.ref_model.load_state_dict(state["reference"], strict=not self.lora)

    def load_training_state(self, state: dict[str, Any]) -> None:
        missing = {"model", "optimizer", "scheduler", "generator", "version", "global_step"} - set(state)
        if missing:
            raise KeyError(f"training state lacks {sorted(missing)}")
        if self.lora:
            missing_keys, unexpected = self.model.load_state_dict(state["model"], strict=False)
            if unexpected or any(".lora_" in k for k in missing_keys):
                raise KeyError(f"checkpoint adapter does not match trainer.lora: unexpected {unexpected[:3]}, "
                               f"missing {[k for k in missing_keys if '.lora_' in k][:3]}")
        else:
            self.model.load_state_dict(state["model"])
        self._load_reference(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        self.version, self.global_step = int(state["version"]), int(state["global_step"])

