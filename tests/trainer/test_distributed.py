"""trainer.num_learners=2: two FSDP2-sharded learner processes (gloo, loopback) train the same
global batch to the same parameters as one learner, holding half the weights and Adam state each."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentrl.config import TrainerConfig, load_config
from agentrl.inference import make_engine
from agentrl.inference.base import SamplingParams
from agentrl.laminar.loop import push_weights
from agentrl.laminar.relay import Relay, RelayChain
from agentrl.models import load_tokenizer, resolve_model
from agentrl.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentrl.trainer.distributed import DistributedLearner, make_learner
from agentrl.trainer.learner import Learner
from agentrl.trainer.sft import sft_train

from .conftest import VOCAB, tiny_llama
from .helpers import random_groups
from .test_learner import set_behaviour_logprobs


def test_two_sharded_learners_equal_one(tmp_path):
    path = tmp_path / "tiny"
    tiny_llama(0).save_pretrained(path)
    groups = random_groups(2, 3, VOCAB, seed=5)
    set_behaviour_logprobs(tiny_llama(0), groups)
    cfg = TrainerConfig(lr=1e-3, micro_batch_size=1)
    single = Learner(tiny_llama(0), cfg)
    m1 = single.step(copy.deepcopy(groups))
    one = single.state_dict_for_inference()
    dl = DistributedLearner(path, cfg, num_learners=2)
    try:
        m2 = dl.step(copy.deepcopy(groups))
        two = dl.state_dict_for_inference()
        chunks = list(dl.iter_weight_chunks(max_bytes=16 << 10))  # a streamed push's parts
        meta = dl.weight_meta()
        shards = dl.shard_bytes()
        state = dl.training_state()
    finally:
        dl.close()
    assert dl.version == 1 and dl.global_step == 1
    assert set(one) == set(two)
    moved = max((one[k] - tiny_llama(0).state_dict()[k]).abs().max().item() for k in one)
    assert moved > 1e-4  # the step did something
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=1e-5, rtol=0, msg=k)
    for k in ("loss", "pg_loss", "grad_norm", "kl_k3_old_roll", "entropy"):
        assert abs(m1[k] - m2[k]) < 1e-5, k
    full_w = sum(p.numel() * 4 for p in single.model.parameters())
    full_opt = 2 * full_w
    for rank in shards:  # each rank holds about half (shards round up per tensor)
        assert rank["weights"] <= 0.6 * full_w and rank["optimizer"] <= 0.6 * full_opt
    torch.testing.assert_close(state["model"]["model.norm.weight"], one["model.norm.weight"])
    # streamed: parts of <= 16 KiB (or one larger tensor) that add up to the gathered weights,
    # described ahead by weight_meta, the tied LM head named as the embedding's twin
    assert len(chunks) > 1 and sum(len(c) for c in chunks) == len(two)
    for c in chunks:
        assert len(c) == 1 or sum(t.numel() * t.element_size() for t in c.values()) <= 16 << 10
        for k, t in c.items():
            assert torch.equal(t, two[k]), k
    assert [m[0] for m in meta] == list(two) and all(tuple(two[n].shape) == shape for n, shape, _, _ in meta)
    assert ("lm_head.weight", "model.embed_tokens.weight") in {(m[0], m[3]) for m in meta}
    assert set(state["model"]) >= set(single.model.state_dict()) - {"lm_head.weight"}


# ---------------------------------------------------------------------------------------------
# Through the factories `agentrl train` uses (agentrl/run.py): config → make_learner / make_engine.
# ---------------------------------------------------------------------------------------------


def tiny_model_dir(tmp_path: Path) -> Path:
    """The tiny Llama as a model folder an engine can load: weights plus the embedded model's
    tokenizer (the tiny vocabulary's ids are a prefix of it)."""
    path = tmp_path / "tiny"
    tiny_llama(0).save_pretrained(path)
    load_tokenizer(resolve_model("smollm2-135m")).save_pretrained(path)
    return path


def config(path: Path, *overrides: str):
    # fp32: the equalities below are the fp32 ones (bf16 rounding would hide a sharding error)
    return load_config(None, overrides=[f"model.name={path}", "engine.kind=hf", "trainer.lr=1e-3",
                                        "trainer.dtype=float32", *overrides])


def on_policy_groups(seed: int) -> list:
    groups = random_groups(2, 3, VOCAB, seed=seed)
    set_behaviour_logprobs(tiny_llama(0), groups)
    return groups


def test_kl_to_the_reference_on_sharded_learners_equals_one_learner(tmp_path):
    """trainer.kl_coef > 0 with trainer.num_learners=2: each rank holds an FSDP2 shard of the
    frozen reference policy too; two steps (the second one away from the reference, so the k3 KL
    and its gradient are not zero) give the single learner's KL and weights within 1e-5. The
    reference then resets to the policy on the ranks (as after a warm start), and the checkpoint
    carries it gathered, loadable by a single learner."""
    path = tiny_model_dir(tmp_path)
    batches = [on_policy_groups(21), on_policy_groups(22)]
    results = {}
    for n in (1, 2):
        cfg = config(path, f"trainer.num_learners={n}", "trainer.micro_batch_size=1", "trainer.kl_coef=0.5").trainer
        learner = make_learner(path, cfg)
        try:
            metrics = [learner.step(copy.deepcopy(b)) for b in batches]
            policy = learner.state_dict_for_inference()
            learner.reset_reference()
            metrics.append(learner.step(copy.deepcopy(batches[0])))
            results[n] = metrics, learner.state_dict_for_inference(), learner.training_state()["reference"], policy
        finally:
            if n == 2:
                learner.close()
    (m1, w1, ref1, policy1), (m2, w2, ref2, _) = results[1], results[2]
    assert m1[1]["kl_ref"] > 1e-6  # the second step saw a KL to the reference
    assert m1[2]["kl_ref"] < 1e-6 and m2[2]["kl_ref"] < 1e-6  # ... and none right after the reset
    for k in policy1:
        torch.testing.assert_close(ref2[k], ref1[k], atol=1e-5, rtol=0, msg=k)
        torch.testing.assert_close(ref1[k], policy1[k], atol=0, rtol=0, msg=k)
    single = make_learner(path, config(path, "trainer.kl_coef=0.5").trainer)
    single.load_training_state({**single.training_state(), "reference": ref2})
    loaded = single.ref_model.state_dict()
    assert all(torch.equal(loaded[k], ref2[k]) for k in policy1)
    for a, b in zip(m1, m2):
        assert abs(a["kl_ref"] - b["kl_ref"]) < 1e-6 and abs(a["loss"] - b["loss"]) < 1e-5
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], atol=1e-5, rtol=0, msg=k)


def test_lora_on_sharded_learners_equals_one_learner_and_checkpoints_the_adapter(tmp_path):
    """trainer.lora with trainer.num_learners=2: the frozen base and the adapters are FSDP2-sharded
    together; after a step the merged weights the engines get (base + B·A·scale, gathered) equal
    the single LoRA learner's within 1e-5; the checkpoint holds the adapter only and loads into a
    single learner, whose merged weights are then the sharded ones. The adapters a vLLM engine
    gets instead (`adapter_views`, gathered) equal the single learner's too."""
    path = tiny_model_dir(tmp_path)
    groups = on_policy_groups(31)
    lora = ("trainer.lora.rank=4", "trainer.lora.alpha=8", "trainer.micro_batch_size=1")
    merged, states, adapters = {}, {}, {}
    for n in (1, 2):
        learner = make_learner(path, config(path, f"trainer.num_learners={n}", *lora).trainer)
        try:
            learner.step(copy.deepcopy(groups))
            merged[n], states[n] = learner.state_dict_for_inference(), learner.training_state()
            adapters[n] = learner.adapter_views()
            if n == 2:
                streamed = {k: v for part in learner.iter_weight_chunks(16 << 10) for k, v in part.items()}
                meta = learner.weight_meta()
        finally:
            if n == 2:
                learner.close()
    base = tiny_llama(0).state_dict()
    assert set(merged[1]) == set(merged[2]) == set(streamed) == {m[0] for m in meta}
    assert max((merged[1][k] - base[k]).abs().max().item() for k in merged[1]) > 1e-5  # the adapters moved
    for k in merged[1]:
        torch.testing.assert_close(merged[2][k], merged[1][k], atol=1e-5, rtol=0, msg=k)
        assert torch.equal(streamed[k], merged[2][k]), k
    assert set(states[2]["model"]) == set(states[1]["model"]) and all(".lora_" in k for k in states[2]["model"])
    assert set(adapters[2]) == set(adapters[1]) and all(k.startswith("base_model.model.") for k in adapters[1])
    assert any(v.abs().max() > 0 for k, v in adapters[1].items() if ".lora_B." in k)  # B moved off its zero init
    for k in adapters[1]:
        torch.testing.assert_close(adapters[2][k], adapters[1][k], atol=1e-5, rtol=0, msg=k)
    single = make_learner(path, config(path, *lora).trainer)
    single.load_training_state(states[2])
    resumed = single.state_dict_for_inference()
    assert max((resumed[k] - merged[2][k]).abs().max().item() for k in resumed) <= 1e-5


@pytest.mark.slow
def test_sharded_checkpoint_resumes_exactly_in_new_learner_processes(tmp_path):
    """trainer.num_learners=2: step, checkpoint (as the run loop does), step again; a new learner
    group (fresh rank processes, nothing carried in memory) loads the checkpoint and takes the
    same second step: parameters and Adam state equal the uninterrupted run's."""
    path = tiny_model_dir(tmp_path)
    # two mini-batches per global batch: the shuffle generator, the LR warm-up and Adam's step
    # count all move within a batch, so each must come back from the checkpoint
    cfg = config(path, "trainer.num_learners=2", "trainer.minibatches=2", "trainer.micro_batch_size=1",
                 "trainer.warmup_steps=3", "trainer.weight_decay=0.01").trainer
    batches = [on_policy_groups(11), on_policy_groups(12)]
    ckpt = tmp_path / "checkpoints"

    learner = make_learner(path, cfg)
    assert isinstance(learner, DistributedLearner)
    try:
        learner.step(copy.deepcopy(batches[0]))
        after_one = learner.state_dict_for_inference()
        save_checkpoint(ckpt, learner, extra={"step": 1})
        learner.step(copy.deepcopy(batches[1]))
        straight_w, straight = learner.state_dict_for_inference(), learner.training_state()
    finally:
        learner.close()

    resumed_learner = make_learner(path, cfg)  # new rank processes, loaded from the model folder
    try:
        assert load_checkpoint(latest_checkpoint(ckpt), resumed_learner) == {"step": 1}
        assert (resumed_learner.version, resumed_learner.global_step) == (1, 2)
        resumed_learner.step(copy.deepcopy(batches[1]))
        resumed_w, resumed = resumed_learner.state_dict_for_inference(), resumed_learner.training_state()
    finally:
        resumed_learner.close()

    assert (resumed["version"], resumed["global_step"]) == (straight["version"], straight["global_step"]) == (2, 4)
    assert max((straight_w[k] - after_one[k]).abs().max().item() for k in straight_w) > 1e-4  # not vacuous
    assert set(resumed_w) == set(straight_w)
    w_diff = max((resumed_w[k] - straight_w[k]).abs().max().item() for k in straight_w)
    opt_a, opt_b = straight["optimizer"]["state"], resumed["optimizer"]["state"]
    assert set(opt_a) == set(opt_b) and opt_a
    opt_diff = max((opt_b[p][s] - opt_a[p][s]).abs().max().item() for p in opt_a for s in opt_a[p])
    print(f"resume: max |Δparam| {w_diff:.3g}, max |Δadam state| {opt_diff:.3g}")
    assert w_diff <= 1e-6 and opt_diff <= 1e-6
    assert resumed["scheduler"] == straight["scheduler"]
    assert torch.equal(resumed["generator"], straight["generator"])


@pytest.mark.slow
async def test_sharded_push_gives_the_engine_the_single_learners_logprobs(tmp_path):
    """The same step on N=1 and on N=2 sharded learners; each one's weights pushed to an hf engine
    from make_engine: the same seeded samples get the same log-probs within 1e-5."""
    path = tiny_model_dir(tmp_path)
    groups = on_policy_groups(5)
    weights = {}
    for n in (1, 2):
        cfg = config(path, f"trainer.num_learners={n}", "trainer.micro_batch_size=1")
        learner = make_learner(path, cfg.trainer, temperature=cfg.sampling.temperature)
        assert isinstance(learner, DistributedLearner) == (n == 2)
        try:
            learner.step(copy.deepcopy(groups))
            weights[n] = learner.state_dict_for_inference()
            if n == 2:  # and streamed into a relay, chunk by chunk, as the training loop pushes it
                chain = RelayChain([Relay("master")])
                await push_weights(SimpleNamespace(chain=chain, weight_dtypes={}, push_adapters=False), learner, 1)
                snap = await chain.master.fetch_latest(policy="local")
                streamed = snap.state_dict()
                assert all(torch.equal(streamed[k], v) for k, v in weights[2].items())
                tied = weights[2]["lm_head.weight"]  # stored once, as the embedding's twin
                assert snap.nbytes < sum(t.numel() * t.element_size() for t in weights[2].values()) - tied.nbytes // 2
                weights[2] = streamed
        finally:
            if n == 2:
                learner.close()
    engine = make_engine(config(path, "engine.max_batch_size=4"))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (int(n),), generator=g).tolist() for n in (5, 9, 7, 12)]
    sampling = [SamplingParams(temperature=1.0, max_tokens=24, seed=100 + i) for i in range(len(prompts))]

    async def sample():
        return await asyncio.gather(*[engine.generate(p, s) for p, s in zip(prompts, sampling)])

    try:
        base = await sample()
        outs = {}
        for n in (1, 2):
            await engine.load_weights(weights[n], 1)
            outs[n] = await sample()
    finally:
        await engine.close()
    diffs, changed = [], 0.0
    for b, one, two in zip(base, outs[1], outs[2]):
        assert one.token_ids == two.token_ids and len(one.token_ids) >= 1
        diffs += [abs(x - y) for x, y in zip(one.logprobs, two.logprobs)]
        if b.token_ids == one.token_ids:  # the push did change the engine's distribution
            changed = max(changed, max(abs(x - y) for x, y in zip(b.logprobs, one.logprobs)))
        else:
            changed = float("inf")
    print(f"engine log-probs N=2 vs N=1 over {len(diffs)} tokens: max |Δ| {max(diffs):.3g}; vs base {changed:.3g}")
    assert max(diffs) <= 1e-5
    assert changed > 1e-4


@pytest.mark.slow
def test_warm_start_on_sharded_learners_equals_one_learner(tmp_path):
    """trainer.warm_start with trainer.num_learners=2: the SFT steps (data parallel over the ranks,
    stopped early by should_stop as Ctrl-C does) and the RL step after them give one learner's
    losses and weights; the RL learning rate and a fresh Adam state come back on the ranks."""
    path = tmp_path / "tiny"
    tiny_llama(0).save_pretrained(path)
    trajs = [t for g in on_policy_groups(7) for t in g.trajectories]
    rl_batch = on_policy_groups(8)
    results = {}
    for n in (1, 2):
        cfg = config(path, f"trainer.num_learners={n}", "trainer.warm_start.enabled=true",
                     "trainer.warm_start.lr=1e-3", "trainer.warm_start.batch_size=3", "trainer.warm_start.epochs=2",
                     "trainer.micro_batch_size=1")  # accepted: config.py no longer refuses warm start with N > 1
        learner = make_learner(path, cfg.trainer, temperature=cfg.sampling.temperature)
        try:
            seen: list[dict] = []
            rows = sft_train(learner, trajs, cfg.trainer.warm_start, on_step=seen.append,
                             should_stop=lambda seen=seen: len(seen) >= 3)
            after_sft = learner.state_dict_for_inference()
            assert (learner.version, learner.global_step) == (1, 3)
            m = learner.step(copy.deepcopy(rl_batch))
            results[n] = rows, after_sft, m, learner.state_dict_for_inference()
        finally:
            if n == 2:
                learner.close()
    (rows1, sft1, m1, w1), (rows2, sft2, m2, w2) = results[1], results[2]
    assert [r["step"] for r in rows2] == [0, 1, 2] and [r["policy_tokens"] for r in rows2] == [
        r["policy_tokens"] for r in rows1]
    for a, b in zip(rows1, rows2):
        assert abs(a["loss"] - b["loss"]) < 1e-5 and abs(a["grad_norm"] - b["grad_norm"]) < 1e-5
    assert rows2[-1]["loss"] < rows2[0]["loss"]  # it learns the data
    sft_diff = max((sft2[k] - sft1[k]).abs().max().item() for k in sft1)
    rl_diff = max((w2[k] - w1[k]).abs().max().item() for k in w1)
    print(f"warm start N=2 vs N=1: max |Δparam| after SFT {sft_diff:.3g}, after the RL step {rl_diff:.3g}")
    assert sft_diff <= 1e-5 and rl_diff <= 1e-5
    assert m1["lr"] == m2["lr"] == 1e-3 and abs(m1["loss"] - m2["loss"]) < 1e-5


@pytest.mark.slow
def test_checkpoints_move_between_one_and_two_learners(tmp_path):
    """A single learner's checkpoint (Adam state keyed by index) resumes on N=2 sharded ranks, and
    theirs (keyed by name) on a single learner; the next step equals the uninterrupted single run
    within the N=2 vs N=1 tolerance (1e-5: the ranks sum gradients in another order)."""
    path = tmp_path / "tiny"
    tiny_llama(0).save_pretrained(path)
    batches = [on_policy_groups(21), on_policy_groups(22)]
    one = config(path, "trainer.num_learners=1", "trainer.micro_batch_size=1").trainer
    two = config(path, "trainer.num_learners=2", "trainer.micro_batch_size=1").trainer

    single = make_learner(path, one)
    single.step(copy.deepcopy(batches[0]))
    from_one = save_checkpoint(tmp_path / "one", single, extra={"step": 1})
    single.step(copy.deepcopy(batches[1]))
    straight = single.state_dict_for_inference()

    sharded = make_learner(path, two)
    try:
        load_checkpoint(from_one, sharded)
        from_two = save_checkpoint(tmp_path / "two", sharded, extra={"step": 1})
        sharded.step(copy.deepcopy(batches[1]))
        one_to_two = sharded.state_dict_for_inference()
    finally:
        sharded.close()
    resumed = make_learner(path, one)
    load_checkpoint(from_two, resumed)
    assert (resumed.version, resumed.global_step) == (1, 1)
    resumed.step(copy.deepcopy(batches[1]))
    two_to_one = resumed.state_dict_for_inference()
    for label, w in (("1->2", one_to_two), ("2->1", two_to_one)):
        diff = max((w[k] - straight[k]).abs().max().item() for k in straight)
        print(f"resume {label}: max |Δparam| vs the uninterrupted single learner {diff:.3g}")
        assert diff <= 1e-5, label


@pytest.mark.ray
@pytest.mark.slow
def test_ray_placed_learner_ranks_equal_spawned_ones(tmp_path):
    """`--ray`: make_learner places the N ranks as Ray actors in one placement group, each rank
    resolving the model itself; the same step gives the spawned ranks' parameters. A learner that
    cannot fit the cluster stops with one line naming the setting, before any rank starts."""
    pytest.importorskip("ray")
    from dataclasses import replace

    from agentrl.config import ModelConfig
    from agentrl.errors import UserError
    from agentrl.laminar.runtime import RayRuntime

    path = tmp_path / "tiny"
    tiny_llama(0).save_pretrained(path)
    groups = on_policy_groups(7)
    cfg = config(path, "trainer.num_learners=2", "trainer.micro_batch_size=1").trainer
    spawned = make_learner(path, cfg)
    try:
        assert spawned.placement == "local"
        m_local = spawned.step(copy.deepcopy(groups))
        local = spawned.state_dict_for_inference()
    finally:
        spawned.close()
    runtime = RayRuntime(address="local", num_cpus=3)
    try:
        from ray.util import placement_group_table

        placed = make_learner(path, cfg, ray_model=ModelConfig(name=str(path)))
        try:
            assert placed.placement == "ray"
            group = placement_group_table(placed._ranks.group)
            assert (group["state"], group["strategy"], len(group["bundles"])) == ("CREATED", "PACK", 2)
            m_ray = placed.step(copy.deepcopy(groups))
            on_ray = placed.state_dict_for_inference()
            assert (placed.version, placed.global_step) == (1, 1)
        finally:
            placed.close()
        with pytest.raises(UserError, match=r"learner_num_gpus.*|exceed the whole Ray cluster"):
            make_learner(path, replace(cfg, learner_num_gpus=1.0), ray_model=ModelConfig(name=str(path)))
    finally:
        runtime.close()
    assert set(on_ray) == set(local)
    assert max((local[k] - tiny_llama(0).state_dict()[k]).abs().max().item() for k in local) > 1e-4
    for k in local:
        torch.testing.assert_close(on_ray[k], local[k], atol=1e-6, rtol=0, msg=k)
    assert abs(m_ray["loss"] - m_local["loss"]) < 1e-6
