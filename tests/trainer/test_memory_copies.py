"""Issue 16's memory budget: how many weight-sized buffers a one-process run holds, checked by
address and byte count on the real embedded model, built by the factories `agentrl train` uses."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import load_config
from agentrl.inference import make_engine
from agentrl.inference.base import SamplingParams
from agentrl.laminar.relay import Relay, checksum, layout
from agentrl.models import load_tokenizer, resolve_configured
from agentrl.trainer.distributed import make_learner
from agentrl.trainer.logprobs import token_logprobs


@pytest.fixture(scope="module")
def cfg():
    # fp32: the log-prob checks below are fp32 equalities (the bf16 engine: tests/test_engine_precision.py)
    return load_config(env="code", overrides=["trainer.warm_start.enabled=false", "eval.enabled=false",
                                              "trainer.dtype=float32"])


@pytest.fixture(scope="module")
def learner(cfg):
    return make_learner(resolve_configured(cfg.model), cfg.trainer, temperature=cfg.sampling.temperature)


def _unique_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() skips tied duplicates


def _inside(t: torch.Tensor, flat: torch.Tensor) -> bool:
    return flat.data_ptr() <= t.data_ptr() < flat.data_ptr() + flat.numel()


def test_relay_buffer_holds_tied_weights_once(learner):
    views = learner.state_dict_views()
    assert views["lm_head.weight"].data_ptr() == views["model.embed_tokens.weight"].data_ptr()  # tied
    specs, size = layout(views)
    by_name = {s.name: s for s in specs}
    assert by_name["lm_head.weight"].offset == by_name["model.embed_tokens.weight"].offset
    unique = _unique_bytes(learner.model)
    assert unique <= size <= unique + 64 * len(specs)  # was unique + the 113 MB embedding again


async def test_engine_shares_the_relay_snapshot_instead_of_copying_it(cfg, learner):
    views = learner.state_dict_views()
    relay = Relay("m")
    await relay.push(views, 1)
    snap = await relay.fetch_latest(-1, policy="local")
    before = checksum(snap.flat)
    shared, copied = make_engine(cfg), make_engine(cfg)
    try:
        await shared.load_weights(snap.state_dict(), 1)
        await copied.load_weights(dict(snap.state_dict()), 1)  # a plain dict: copied as before
        params = list(shared.model.parameters())
        assert all(_inside(p, snap.flat) for p in params)  # no second copy of the rollout weights
        assert not any(_inside(p, snap.flat) for p in copied.model.parameters())
        assert shared.model.lm_head.weight is shared.model.model.embed_tokens.weight  # still tied
        tok = load_tokenizer(resolve_configured(cfg.model))
        prompt = list(tok.apply_chat_template([{"role": "user", "content": "Write a haiku about rain."}],
                                              add_generation_prompt=True, tokenize=True, return_dict=False))
        sp = SamplingParams(temperature=1.0, max_tokens=12, seed=3)
        a, b = await shared.generate(prompt, sp), await copied.generate(prompt, sp)
        # the same weights; the GEMMs over the relay's buffer round differently by ~4e-6 (two
        # engines that both copied agree bitwise), well inside the 1e-4 kept with the trainer
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 2e-5
        ids = torch.tensor([prompt + a.token_ids])
        with torch.no_grad():
            ref = token_logprobs(learner.model.eval(), ids, temperature=sp.temperature)[0, len(prompt):]
        learner.model.train()
        assert float((ref - torch.tensor(a.logprobs)).abs().max()) < 1e-4
        # a later plain load must not write into the relay's buffer (other workers read it)
        other = {k: v + 1.0 for k, v in dict(snap.state_dict()).items() if k == "model.norm.weight"}
        await shared.load_weights(other, 2)
        assert checksum(snap.flat) == before
        assert not _inside(shared.model.model.norm.weight, snap.flat)
        assert torch.equal(shared.model.model.norm.weight, other["model.norm.weight"])
    finally:
        await shared.close()
        await copied.close()
        await relay.stop()


async def test_prefix_store_is_empty_during_the_learner_step():
    """global-async: once the trainer holds its batch, every trajectory of it has finished, so the
    engine's kept prefixes are released before the learner steps (not after the weight swap)."""
    from agentrl.laminar.loop import build_system, shutdown, train
    from agentrl.laminar.runtime import LocalRuntime
    from tests.laminar.helpers import make_spread_env, small_config, tail_tasks

    cfg = small_config("global-async", **{"sampling.max_tokens": 3, "trainer.steps": 2, "trainer.lr": 1e-6,
                                          "laminar.num_relays": 1})
    engine = make_engine(cfg)
    learner = make_learner(resolve_configured(cfg.model), cfg.trainer, temperature=cfg.sampling.temperature,
                           reward_cfg=cfg.reward)
    held: list[int] = []
    orig_step = learner.step

    def step(groups):
        held.append(engine._prefix.bytes)  # the learner thread: the next batch generates meanwhile
        return orig_step(groups)

    learner.step = step
    system = await build_system(cfg, make_spread_env, tail_tasks(2, long_turns=3, tool_s=0.3), [engine],
                                LocalRuntime(), shuffle_prompts=False)
    try:
        await train(system, learner, cfg.trainer.steps, cfg.trainer.batch_groups)
    finally:
        await shutdown(system)
        await engine.close()
    assert engine.metrics["prefix_hit_tokens"] > 0  # the store was in use between turns
    assert len(held) == 2 and held[0] == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
async def test_engine_shares_the_first_push_and_holds_no_weights_of_its_own(cfg, learner, dtype):
    """Before any step trains, the rollout engine's weights are the relay's v0 buffer (its worker
    never pulls v0: it loaded the same weights from disk). A bf16 engine too: the relay stores the
    linear weights in bf16 (`LaminarSystem.weight_dtypes`), half their fp32 bytes."""
    from agentrl.laminar.loop import build_system, shutdown, train
    from agentrl.laminar.runtime import LocalRuntime
    from tests.laminar.helpers import make_spread_env, small_config, tail_tasks

    small = small_config("global-async", **{"laminar.num_relays": 1})
    engine = make_engine(load_config(env="code", overrides=[f"trainer.dtype={dtype}"]))
    own = {p.data_ptr() for p in engine.model.parameters()}
    system = await build_system(small, make_spread_env, tail_tasks(1), [engine], LocalRuntime())
    try:
        await train(system, learner, 0, 1)  # the first push only
        snap = await system.chain.master.fetch_latest(-1, policy="local")
        assert snap.version == learner.version
        assert all(_inside(p, snap.flat) for p in engine.model.parameters())
        assert not own & {p.data_ptr() for p in engine.model.parameters()}
        assert system.weight_dtypes == engine.weight_dtypes
        unique = _unique_bytes(learner.model)
        halved = sum(p.numel() * 2 for n, p in learner.model.named_parameters() if n in engine.weight_dtypes)
        assert bool(halved) == (dtype == "bfloat16")
        assert unique - halved <= snap.nbytes <= unique - halved + 64 * 300
    finally:
        await shutdown(system)
        await engine.close()


async def test_eval_engine_keeps_no_kv_after_an_evaluation(tmp_path, learner):
    from agentrl.env_builder import make_env
    from agentrl.sandboxes import make_pool
    from agentrl.stages import Stages

    cfg = load_config(env="code", overrides=["trainer.warm_start.enabled=false", "eval.enabled=true", "eval.n=2",
                                             "sampling.max_tokens=8", "env.max_turns=1", "sandbox.pool_size=2"])
    pool = make_pool(cfg.sandbox, run_id="evalkv", name="evalkv")
    await pool.start()
    stages = await Stages.start(cfg, tmp_path, learner, lambda: make_env(cfg, pool), [])
    freed: list[int] = []
    drop = stages.eval_engine.drop_prefixes

    async def spy() -> int:
        freed.append(await drop())
        return freed[-1]

    stages.eval_engine.drop_prefixes = spy
    try:
        await stages.evaluate("base", 0)
        assert stages.eval_engine.metrics["prefill_tokens"] > 0
        assert freed and freed[0] > 0  # it kept the finished turns' KV ...
        assert stages.eval_engine._prefix.bytes == 0  # ... and released it when the evaluation ended
        # Between evaluations it holds no weights of its own: views of the learner's, or nothing
        # (the bf16 casts it made are freed), so the learner's steps do not pay for them.
        learner_ptrs = {p.data_ptr() for p in learner.model.parameters()}
        engine_params = list(stages.eval_engine.model.parameters())
        assert all(p.numel() == 0 or p.data_ptr() in learner_ptrs for p in engine_params)
        assert stages.eval_engine.autocast != "bfloat16" or any(p.numel() == 0 for p in engine_params)
        again = await stages.evaluate("final", 1)  # the weights come back for the next evaluation
        assert again["heldout_n"] == 2 and again["heldout_errors"] == 0
    finally:
        await stages.close()
        await pool.close()
