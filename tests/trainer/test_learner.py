"""The learner on a tiny real Llama: accumulation equivalence, TRM zero gradient, every config
option runs, learning direction, weights for engines."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from agentrl.config import RewardConfig, TrainerConfig, load_config
from agentrl.trainer.learner import Learner
from agentrl.trainer.logprobs import token_logprobs
from agentrl.types import Group, Status

from .conftest import VOCAB, tiny_llama
from .helpers import random_groups, segment, trajectory


def set_behaviour_logprobs(model, groups: list[Group], temperature: float = 1.0) -> None:
    """Fill behaviour log-probs with the model's own (an on-policy batch, ρ = 1)."""
    for g in groups:
        for t in g.trajectories:
            for seg in t.segments:
                with torch.no_grad():
                    lp = token_logprobs(model, torch.tensor([seg.token_ids]), temperature=temperature)[0]
                seg.logprobs = [float(x) if m else 0.0 for x, m in zip(lp, seg.loss_mask)]


def params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def run_step(cfg: TrainerConfig, groups, seed: int = 0, **kw) -> tuple[Learner, dict]:
    learner = Learner(tiny_llama(seed), cfg, **kw)
    return learner, learner.step(copy.deepcopy(groups))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                 "seq-mean-token-sum-norm"])
def test_micro_batching_equals_one_big_batch(agg):
    groups = random_groups(2, 4, VOCAB)
    set_behaviour_logprobs(tiny_llama(0), groups)
    base = dict(lr=1e-3, loss_agg=agg, minibatches=1)
    start = params(tiny_llama(0))
    a, ma = run_step(TrainerConfig(micro_batch_size=8, **base), groups)
    b, mb = run_step(TrainerConfig(micro_batch_size=1, **base), groups)
    assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-5)
    assert ma["loss"] == pytest.approx(mb["loss"], abs=1e-6)
    # Adam's first step is ~lr·sign(g): compare the updates relative to their size
    da, db = params(a.model) - start, params(b.model) - start
    assert (da - db).abs().max() < 1e-2 * da.abs().max()
    assert a.version == 1 and a.global_step == 1


def test_micro_batch_tokens_caps_the_padded_tokens_per_pass_and_keeps_the_update():
    groups = random_groups(2, 4, VOCAB)
    set_behaviour_logprobs(tiny_llama(0), groups)
    longest = max(len(s.token_ids) for g in groups for t in g.trajectories for s in t.segments)
    budget = 2 * longest  # at most two rows per pass, fewer when they are long
    passes: list[tuple[int, int]] = []
    capped = Learner(tiny_llama(0), TrainerConfig(lr=1e-3, micro_batch_size=8, micro_batch_tokens=budget))
    capped.model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _out: passes.append(tuple(args[0].shape)))
    mc = capped.step(copy.deepcopy(groups))
    uncapped, mu = run_step(TrainerConfig(lr=1e-3, micro_batch_size=8, micro_batch_tokens=0), groups)
    assert len(passes) >= 4 and all(rows * width <= budget for rows, width in passes), passes
    assert mc["grad_norm"] == pytest.approx(mu["grad_norm"], rel=1e-5)
    start = params(tiny_llama(0))
    dc, du = params(capped.model) - start, params(uncapped.model) - start
    assert (dc - du).abs().max() < 1e-2 * du.abs().max()


def test_trm_rejected_sequence_contributes_zero_gradient():
    groups = random_groups(2, 4, VOCAB)
    set_behaviour_logprobs(tiny_llama(0), groups)
    victim = groups[0].trajectories[1].segments[0]
    victim.logprobs = [lp - 0.5 * m for lp, m in zip(victim.logprobs, victim.loss_mask)]  # log ρ = 0.5 > √0.2
    other = copy.deepcopy(groups)
    seg = other[0].trajectories[1].segments[0]
    seg.token_ids = [t if m == 0 else (t + 7) % VOCAB for t, m in zip(seg.token_ids, seg.loss_mask)]
    cfg = TrainerConfig(lr=1e-3, trm=load_config(overrides=["trainer.trm.mode=max"]).trainer.trm)
    a, ma = run_step(cfg, groups)
    b, mb = run_step(cfg, other)
    assert mb["trm_masked_fraction"] == pytest.approx(1 / 8)
    assert ma["trm_masked_fraction"] == pytest.approx(1 / 8)
    assert (params(a.model) - params(b.model)).abs().max() == 0  # the rejected tokens changed nothing
    c, _ = run_step(TrainerConfig(lr=1e-3), other)  # TRM off: the changed tokens do matter
    assert (params(a.model) - params(c.model)).abs().max() > 0


OPTIONS = [
    [], ["trainer.loss=gspo"], ["trainer.loss=reinforce"], ["trainer.advantage=otb"],
    ["trainer.advantage=rloo", "trainer.dual_clip=3.0"], ["trainer.advantage=drgrpo",
     "trainer.loss_agg=seq-mean-token-sum-norm", "trainer.loss_scale_factor=64"],
    ["trainer.decoupled=false"], ["trainer.tis_cap=null"], ["trainer.kl_coef=0.1"],
    ["trainer.trm.mode=both", "trainer.trm.delta=0.05", "trainer.trm.normalize=accepted"],
    ["trainer.minibatches=3", "trainer.micro_batch_size=2", "trainer.warmup_steps=4"],
    ["trainer.dynamic_sampling=true", "trainer.overlong.enabled=true", "trainer.overlong.max_len=6",
     "trainer.overlong.cache_len=2", "reward.gate=0.5"],
]


@pytest.mark.parametrize("overrides", OPTIONS, ids=lambda o: ",".join(o) or "defaults")
def test_every_option_from_dotted_overrides_runs(overrides):
    # fp32: the behaviour log-probs below are fp32 ones, and on-policy means the same precision
    cfg = load_config(overrides=["trainer.dtype=float32", *overrides])
    groups = random_groups(3, 4, VOCAB, seed=1)
    groups.append(Group("flat", "flat", [trajectory(f"f{j}", "flat", 1.0, [segment([1, 2], [3, 4])])
                                         for j in range(4)]))
    set_behaviour_logprobs(tiny_llama(), groups)  # on-policy: TRM accepts everything
    learner = Learner(tiny_llama(), cfg.trainer, reward_cfg=cfg.reward)
    before = params(learner.model)
    m = learner.step(groups)
    for key in ("loss", "pg_loss", "clip_fraction", "trm_masked_fraction", "kl_k3_old_roll", "mean_abs_log_rho",
                "entropy", "grad_norm", "tokens_per_s", "adv_mean", "lr", "reward_mean"):
        assert math.isfinite(m[key]), key
    assert m["optimizer_steps"] == cfg.trainer.minibatches and learner.version == 1
    assert m["trm_masked_fraction"] == 0 and m["mean_abs_log_rho"] < 1e-5
    assert (params(learner.model) - before).abs().max() > 0
    if cfg.trainer.dynamic_sampling:
        assert m["dropped_zero_variance_groups"] == 1


def test_rewards_gated_here_and_error_trajectories_dropped():
    groups = random_groups(1, 4, VOCAB)
    for t, (outcome, steps) in zip(groups[0].trajectories, [(-0.5, [0.1] * 3), (0.0, [0.1] * 2), (1.0, [0.1]),
                                                            (-1.0, [0.1] * 30)]):
        t.outcome_reward, t.step_rewards = outcome, steps
    groups[0].trajectories.append(trajectory("e", "g0", 5.0, [segment([1], [2, 3])], status=Status.ERROR))
    learner = Learner(tiny_llama(), TrainerConfig(), reward_cfg=RewardConfig(gate=0.0))
    m = learner.step(groups)
    assert [t.reward for t in groups[0].trajectories[:4]] == pytest.approx([-0.5, 0.2, 1.1, -1.0])
    assert m["reward_mean"] == pytest.approx((-0.5 + 0.2 + 1.1 - 1.0) / 4)
    assert m["dropped_error_trajectories"] == 1


def test_all_masked_batch_is_skipped_without_version_bump():
    groups = random_groups(1, 2, VOCAB)
    for t in groups[0].trajectories:
        t.status = Status.ABORTED
    learner = Learner(tiny_llama(), TrainerConfig())
    assert learner.step(groups)["skipped"] == 1 and learner.version == 0


def test_batch_of_equal_reward_groups_leaves_the_weights_alone():
    """Zero advantages everywhere: no optimizer step (Adam would still move along its momentum)."""
    groups = random_groups(2, 4, VOCAB)
    set_behaviour_logprobs(tiny_llama(0), groups)
    learner, first = run_step(TrainerConfig(lr=1e-3), groups)
    assert first["optimizer_steps"] == 1 and learner.version == 1
    for g in groups:
        for t in g.trajectories:
            t.reward = 0.0
    before = params(learner.model)
    m = learner.step(copy.deepcopy(groups))
    assert m["skipped"] == 1 and learner.version == 1 and learner.global_step == 1
    assert torch.equal(params(learner.model), before)
    with_kl = Learner(tiny_llama(0), TrainerConfig(lr=1e-3, kl_coef=0.1))  # a KL term still pulls
    assert "skipped" not in with_kl.step(copy.deepcopy(groups)) and with_kl.version == 1


def test_updates_move_probability_towards_positive_advantage():
    """A fixed on-policy batch: sequences with reward 1 gain log-prob, reward 0 ones lose it."""
    groups = random_groups(2, 4, VOCAB, seed=3)
    model = tiny_llama(0)
    set_behaviour_logprobs(model, groups)
    learner = Learner(model, TrainerConfig(lr=3e-3, minibatches=2))

    def seq_logp(t) -> float:
        seg = t.segments[0]
        with torch.no_grad():
            lp = token_logprobs(learner.model, torch.tensor([seg.token_ids]))[0]
        return float((lp * torch.tensor(seg.loss_mask)).sum())

    trajs = [t for g in groups for t in g.trajectories]
    before = [seq_logp(t) for t in trajs]
    for _ in range(3):
        learner.step(groups)
    delta = [seq_logp(t) - b for t, b in zip(trajs, before)]
    up = [d for d, t in zip(delta, trajs) if t.reward == 1.0]
    down = [d for d, t in zip(delta, trajs) if t.reward == 0.0]
    assert min(up) > 0 and max(down) < 0, (up, down)
    assert learner.version == 3 and learner.global_step == 6


def test_state_dict_for_inference_is_a_detached_copy():
    learner = Learner(tiny_llama(), TrainerConfig())
    sd = learner.state_dict_for_inference()
    assert set(sd) == set(learner.model.state_dict())
    name = "model.embed_tokens.weight"
    sd[name].add_(1.0)
    assert not torch.equal(sd[name], learner.model.state_dict()[name])
    assert all(not v.requires_grad for v in sd.values())


def test_bad_arguments_named():
    with pytest.raises(ValueError, match="temperature"):
        Learner(tiny_llama(), TrainerConfig(), temperature=0)
    with pytest.raises(ValueError, match="micro_batch_size"):
        Learner(tiny_llama(), TrainerConfig(micro_batch_size=0))


@pytest.mark.parametrize("loss", ["ppo", "gspo"])
def test_lean_step_equals_the_recompute(loss, monkeypatch):
    """Under the defaults (one mini-batch, GRPO, TRM off) π_prox comes from the training forward:
    the update and the π_old metrics equal those of an explicit recompute."""
    groups = random_groups(2, 3, VOCAB, seed=3)
    set_behaviour_logprobs(tiny_llama(0), groups)
    for g in groups:  # off-policy enough for the IS weights and clipping to matter
        for t in g.trajectories:
            for seg in t.segments:
                seg.logprobs = [x - 0.1 * (i % 3) if x else 0.0 for i, x in enumerate(seg.logprobs)]
    cfg = TrainerConfig(lr=1e-3, micro_batch_size=2, loss=loss)
    lean, m_lean = run_step(cfg, groups)
    monkeypatch.setattr(Learner, "prox_from_training_forward", lambda self, n: False)
    full, m_full = run_step(cfg, groups)
    assert m_lean["prox_recomputed"] == 0.0 and m_full["prox_recomputed"] == 1.0
    assert not torch.equal(params(lean.model), params(tiny_llama(0)))
    torch.testing.assert_close(params(lean.model), params(full.model), atol=1e-5, rtol=0)  # Adam: lr 1e-3 steps
    for k in ("loss", "kl_k3_old_roll", "mean_abs_log_rho", "entropy_old", "entropy", "clip_fraction"):
        assert m_lean[k] == pytest.approx(m_full[k], abs=1e-5), k


def test_recompute_kept_where_prox_differs():
    """Two mini-batches, OTB or TRM need π_old before the loss: the recompute stays."""
    learner = Learner(tiny_llama(), TrainerConfig())
    assert learner.prox_from_training_forward(4)
    for over in (["trainer.minibatches=2"], ["trainer.advantage=otb"], ["trainer.trm.mode=max"]):
        assert not Learner(tiny_llama(), load_config(None, overrides=over).trainer).prox_from_training_forward(4)
    learner.model.config.attention_dropout = 0.1
    assert not learner.prox_from_training_forward(4)


def test_the_kl_reference_resets_to_the_policy_and_resumes_from_a_checkpoint():
    """After a warm start the KL's reference is the warm-started policy (reset_reference); a
    checkpoint carries it, so a resumed run does not fall back to the run's base model."""
    groups = random_groups(2, 3, VOCAB, seed=4)
    set_behaviour_logprobs(tiny_llama(0), groups)
    cfg = TrainerConfig(lr=1e-2, kl_coef=0.1)
    learner = Learner(tiny_llama(0), cfg)
    learner.step(copy.deepcopy(groups))  # stands in for the warm start: the policy leaves the base
    assert not torch.equal(params(learner.ref_model), params(learner.model))
    learner.reset_reference()
    assert torch.equal(params(learner.ref_model), params(learner.model))
    assert learner.step(copy.deepcopy(groups))["kl_ref"] < 1e-6  # the first step from it: no divergence yet
    state = learner.training_state()
    fresh = Learner(tiny_llama(0), cfg)
    assert not torch.equal(params(fresh.ref_model), params(learner.ref_model))
    fresh.load_training_state(copy.deepcopy(state))
    assert torch.equal(params(fresh.ref_model), params(learner.ref_model))
    assert "reference" not in Learner(tiny_llama(0), TrainerConfig()).training_state()  # no KL, no copy


def test_replay_adds_the_scaled_sft_gradient_of_the_warm_start_sequences():
    """trainer.warm_start.replay_coef (PPO-ptx): an RL update's gradient gains γ · ∇ of the SFT loss
    (mean NLL of the policy tokens, temperature 1) of the replayed rows, and repeated steps with it
    pull the policy toward those sequences where steps without it do not."""
    from agentrl.trainer.losses import sft_loss
    from agentrl.trainer.sft import sft_batch

    demos = [t for g in random_groups(2, 2, VOCAB, seed=9) for t in g.trajectories]
    replay = sft_batch(demos)
    cfg = load_config(None, overrides=["trainer.warm_start.enabled=true", "trainer.warm_start.replay_coef=0.5",
                                       f"trainer.warm_start.replay_rows={len(demos)}", "trainer.micro_batch_size=2",
                                       "trainer.dtype=float32"]).trainer
    learner = Learner(tiny_llama(0), cfg, temperature=0.7)
    learner.set_replay(replay)
    loss = learner.replay_backward()  # all rows: the draw's order does not matter
    got = [p.grad.clone() for p in learner.model.parameters()]
    learner.model.zero_grad(set_to_none=True)
    logp = token_logprobs(learner.model, replay.input_ids, replay.attention_mask, temperature=1.0)
    want = 0.5 * sft_loss(logp, replay.loss_mask)
    want.backward()
    assert loss == pytest.approx(want.item(), rel=1e-5)
    for g, p in zip(got, learner.model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)

    groups = random_groups(2, 3, VOCAB, seed=4)
    set_behaviour_logprobs(tiny_llama(0), groups, temperature=0.7)

    def nll_after_steps(coef: float) -> float:
        over = ["trainer.warm_start.enabled=true", f"trainer.warm_start.replay_coef={coef}",
                "trainer.warm_start.replay_rows=2", "trainer.lr=1e-3", "trainer.dtype=float32"]
        lr = Learner(tiny_llama(0), load_config(None, overrides=over).trainer, temperature=0.7)
        lr.set_replay(replay if coef else None)
        for _ in range(4):
            metrics = lr.step(copy.deepcopy(groups))
        assert ("replay_loss" in metrics) == (coef > 0)
        with torch.no_grad():
            return sft_loss(token_logprobs(lr.model, replay.input_ids, replay.attention_mask), replay.loss_mask).item()

    assert nll_after_steps(1.0) < nll_after_steps(0.0) - 0.05


def test_lora_trains_the_adapter_pushes_merged_weights_and_checkpoints_the_adapter_only():
    groups = random_groups(2, 3, VOCAB, seed=4)
    set_behaviour_logprobs(tiny_llama(0), groups)
    cfg = load_config(None, overrides=["trainer.lora.rank=4", "trainer.lr=1e-2", "trainer.lora.targets=[q_proj,v_proj]"]
                      ).trainer
    learner = Learner(tiny_llama(0), cfg)
    base = tiny_llama(0).state_dict()
    learner.step(copy.deepcopy(groups))
    merged = learner.state_dict_for_inference()
    assert set(merged) == set(base)  # HF names, no adapter keys: any engine loads it
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(merged[q], base[q])  # the adapter's delta is merged in
    torch.testing.assert_close(merged["model.layers.0.mlp.up_proj.weight"], base["model.layers.0.mlp.up_proj.weight"])
    state = learner.training_state()
    assert state["model"] and all(".lora_" in k for k in state["model"])
    fresh = Learner(tiny_llama(0), cfg)
    fresh.load_training_state(copy.deepcopy(state))
    torch.testing.assert_close(fresh.state_dict_for_inference()[q], merged[q])
    # `agentrl eval` of a LoRA run's checkpoint: the base model with the adapter merged in
    from agentrl.trainer.learner import merged_lora_weights

    torch.testing.assert_close(merged_lora_weights(tiny_llama(0), cfg.lora, state["model"])[q], merged[q])


def test_activation_checkpointing_saves_less_for_backward_and_trains_the_same():
    """Per-decoder-layer checkpointing: fewer bytes held for backward, the same update."""
    from agentrl.trainer.logprobs import token_logprobs_and_stats

    def saved_bytes(learner: Learner) -> int:
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        ids = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            token_logprobs_and_stats(learner.model, ids, None, 1.0, positions=torch.ones_like(ids, dtype=torch.bool))
        return total

    groups = random_groups(2, 2, VOCAB, seed=6)
    set_behaviour_logprobs(tiny_llama(0), groups)
    on, _ = run_step(TrainerConfig(lr=1e-3, activation_checkpointing=True), groups)
    off, _ = run_step(TrainerConfig(lr=1e-3, activation_checkpointing=False), groups)
    assert saved_bytes(on) < 0.6 * saved_bytes(off)
    torch.testing.assert_close(params(on.model), params(off.model), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_warm_start_forward_runs_under_trainer_dtype_like_the_rl_forward(dtype: str) -> None:
    from agentrl.config import WarmStartConfig
    from agentrl.trainer.sft import sft_train

    learner = Learner(tiny_llama(0), TrainerConfig(dtype=dtype))
    seen: list[torch.dtype | None] = []
    learner.model.model.layers[0].mlp.register_forward_hook(
        lambda module, args, out: seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu")
                                              else None))
    trajs = [t for g in random_groups(1, 2, VOCAB) for t in g.trajectories]
    rows = sft_train(learner, trajs, WarmStartConfig(epochs=1, batch_size=2))
    assert rows and all(math.isfinite(r["loss"]) for r in rows)
    assert seen and set(seen) == {None if dtype == "float32" else torch.bfloat16}


def test_the_warm_start_maps_its_tensors_at_the_configured_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from agentrl.config import WarmStartConfig
    from agentrl.trainer.sft import sft_train

    thresholds: list[int] = []
    monkeypatch.setattr("agentrl.trainer.sft.mapped_tensors",
                        lambda threshold: thresholds.append(threshold) or contextlib.nullcontext())
    learner = Learner(tiny_llama(0), TrainerConfig())
    trajs = [t for g in random_groups(1, 2, VOCAB) for t in g.trajectories]
    sft_train(learner, trajs, WarmStartConfig(epochs=1, batch_size=2, mmap_threshold_mb=16))
    assert thresholds == [16 << 20]


@pytest.mark.parametrize(("avx512_bf16", "amx", "expected"), [(True, False, "bfloat16"), (False, True, "bfloat16"),
                                                              (False, False, "float32")])
def test_auto_dtype_is_bf16_only_where_the_cpu_multiplies_it_natively(monkeypatch: pytest.MonkeyPatch,
                                                                      avx512_bf16: bool, amx: bool,
                                                                      expected: str) -> None:
    from agentrl.trainer.learner import autocast_dtype

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert autocast_dtype("auto", "cpu") == expected
    assert autocast_dtype("float32", "cpu") == "float32" and autocast_dtype("bfloat16", "cpu") == "bfloat16"
    learner = Learner(tiny_llama(0), TrainerConfig(dtype="auto"))
    assert learner.dtype == expected
    with learner._autocast():
        assert torch.is_autocast_enabled("cpu") == (expected == "bfloat16")


def test_adamw_is_torchs_fused_kernel_on_plain_parameters():
    learner = Learner(tiny_llama(), TrainerConfig())
    assert isinstance(learner.optimizer, torch.optim.AdamW) and learner.optimizer.defaults["fused"] is True


def test_adamw8bit_keeps_8bit_moments_follows_adamw_and_resumes_exactly():
    """trainer.optimizer=adamw8bit (bitsandbytes): uint8 moments for every large tensor, an update
    that tracks AdamW's, and a state dict that resumes to the same next step, bit for bit."""
    torch.manual_seed(0)
    big = torch.nn.Linear(256, 256)  # 65 536 weights: over bitsandbytes' 4 096-element 8-bit floor
    model = torch.nn.Sequential(big)
    from agentrl.trainer.learner import make_optimizer

    def train(m: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int = 0) -> None:
        for step in range(steps):
            g = torch.Generator().manual_seed(seed + step)
            for p in m.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()

    def fresh(optimizer_name: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        m = copy.deepcopy(model)
        return m, make_optimizer(list(m.parameters()), TrainerConfig(lr=1e-3, optimizer=optimizer_name))

    eight, opt8 = fresh("adamw8bit")
    full, opt32 = fresh("adamw")
    train(eight, opt8, 5)
    train(full, opt32, 5)
    moments = opt8.state[next(eight.parameters())]
    assert moments["state1"].dtype == torch.uint8 and moments["state2"].dtype == torch.uint8
    moved = (params(full) - params(model)).abs().mean()
    assert moved > 1e-3  # the comparison below is not vacuous
    assert (params(eight) - params(full)).abs().mean() < 0.05 * moved  # 8-bit moments, the same rule
    # save after 5 steps, load into a fresh model and optimizer: 2 more steps == 2 more straight on
    after_five = params(eight)
    resumed, opt_resumed = fresh("adamw8bit")
    resumed.load_state_dict(copy.deepcopy(eight.state_dict()))
    opt_resumed.load_state_dict(copy.deepcopy(opt8.state_dict()))
    train(resumed, opt_resumed, 2, seed=100)
    train(eight, opt8, 2, seed=100)
    assert torch.equal(params(resumed), params(eight))
    assert not torch.equal(params(resumed), after_five)


def test_adamw8bit_learner_steps_and_its_warm_start_clears_the_moments():
    from agentrl.trainer.sft import sft_steps

    cfg = load_config(overrides=["trainer.dtype=float32", "trainer.optimizer=adamw8bit"]).trainer
    learner = Learner(tiny_llama(), cfg)
    assert type(learner.optimizer).__module__.startswith("bitsandbytes")
    groups = random_groups(2, 4, VOCAB, seed=1)
    set_behaviour_logprobs(tiny_llama(), groups)
    before = params(learner.model)
    m = learner.step(groups)
    assert learner.version == 1 and math.isfinite(m["loss"]) and (params(learner.model) - before).abs().max() > 0
    assert learner.optimizer.state  # moments exist after a step
    from agentrl.trainer.sft import sft_batch

    batch = sft_batch([t for g in groups for t in g.trajectories])
    rows = list(sft_steps(learner, batch, cfg.warm_start))
    assert rows and all(math.isfinite(r["loss"]) for r in rows)
    assert not learner.optimizer.state  # cleared for RL, as with AdamW


def test_auto_optimizer_is_8bit_in_one_process_and_fused_adamw_on_plain_tensors_otherwise():
    """trainer.optimizer=auto (configs/code.yaml, swe.yaml): bitsandbytes' 8-bit moments for one
    learner process; DTensor shards (FSDP2, num_learners > 1) get torch's AdamW instead."""
    from torch.distributed.tensor import DTensor

    from agentrl.trainer.learner import make_optimizer

    cfg = load_config(overrides=["trainer.optimizer=auto"]).trainer
    assert type(Learner(tiny_llama(), cfg).optimizer).__module__.startswith("bitsandbytes")
    shard = torch.nn.Parameter(torch.zeros(4))
    shard.to_local = lambda: shard  # what make_optimizer looks for on FSDP2's parameters
    assert not isinstance(shard, DTensor) and type(make_optimizer([shard], cfg)) is torch.optim.AdamW



def first_gradient(cfg: TrainerConfig, groups: list[Group]) -> tuple[torch.Tensor, dict]:
    """The gradient of a step's first optimizer update, and the step's metrics (Adam's update is
    about lr·sign(g), so near-zero gradients flip on rounding: compare gradients, not weights)."""
    learner = Learner(tiny_llama(0), cfg)
    grads: list[torch.Tensor] = []
    step = learner.optimizer.step

    def record(*args, **kwargs):
        grads.append(torch.cat([p.grad.flatten() for p in learner.model.parameters()]))
        return step(*args, **kwargs)

    learner.optimizer.step = record  # (torch warns that the scheduler's wrapper was replaced)
    metrics = learner.step(copy.deepcopy(groups))
    return grads[0], metrics


@pytest.mark.parametrize("overrides", [[], ["trainer.trm.mode=max"]])
def test_a_demonstrated_trajectory_trains_as_if_sampled_by_the_policy(overrides):
    """An expert's trajectory (demo guidance) has placeholder behaviour log-probs of 0: the learner
    treats it as sampled by π_prox, so its gradient equals that of the same batch with the model's
    own log-probs as behaviour, in the lean pass and with the recompute (TRM on)."""
    groups = random_groups(2, 3, VOCAB, seed=5)
    set_behaviour_logprobs(tiny_llama(0), groups)
    cfg = load_config(None, overrides=["trainer.micro_batch_size=2", "trainer.dtype=float32", *overrides]).trainer
    placeholder = copy.deepcopy(groups)
    for seg in placeholder[0].trajectories[0].segments:  # what agentrl/demos.py's teacher records
        seg.logprobs = [0.0] * len(seg.logprobs)
    flagged = copy.deepcopy(placeholder)
    flagged[0].trajectories[0].metrics["demonstration"] = 1.0
    assert flagged[0].trajectories[0].demonstrated and not groups[0].trajectories[0].demonstrated
    g_on, m_on = first_gradient(cfg, groups)
    g_demo, m_demo = first_gradient(cfg, flagged)
    g_face, _ = first_gradient(cfg, placeholder)
    scale = g_on.abs().max().item()
    assert (g_demo - g_on).abs().max().item() < 1e-4 * scale
    assert m_demo["trm_masked_fraction"] == m_on["trm_masked_fraction"]
    assert m_demo["mean_abs_log_rho"] == pytest.approx(m_on["mean_abs_log_rho"], abs=1e-5)
    # taken at face value, the placeholders would weight that row by π_prox (or TRM would mask it)
    assert (g_face - g_on).abs().max().item() > 1e-2 * scale
