"""Exact resume: a run stopped after step k and resumed from its checkpoint trains on the same
groups in the same order, with parameters equal to a run never stopped (sync backend, a
deterministic engine, the real Learner on the embedded model)."""

import hashlib

import torch

from agentrl.inference.base import GenerateOutput, SamplingParams
from agentrl.laminar.loop import build_system, shutdown, train
from agentrl.laminar.runtime import LocalRuntime
from agentrl.models import resolve_model
from agentrl.trainer.checkpoint import load_checkpoint, save_checkpoint
from agentrl.trainer.learner import Learner

from .helpers import FakeEngine, make_env, small_config


class GreedyLikeEngine(FakeEngine):
    """Tokens a pure function of (prompt, weight version): what greedy decoding gives."""

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateOutput:
        h = int(hashlib.sha256(repr((prompt_ids, self.version)).encode()).hexdigest(), 16)
        n = 1 + h % sampling.max_tokens
        ids = [self.words[(h >> (8 * i)) % len(self.words)] for i in range(n)]
        return GenerateOutput(ids, [-1.0] * n, "length", self.version)

    async def load_weights(self, state_dict, version):
        self.version = version


TASKS = [{"id": f"t{i}", "turns": 1, "tool_s": 0.0} for i in range(3)]


async def _run(cfg, learner, path, steps, resume_state=None):
    from agentrl.models import load_tokenizer

    engine = GreedyLikeEngine(load_tokenizer(path))
    seen: list[list[str]] = []
    states: list[dict] = []

    def on_step(rec):
        seen.append([g.id for g in rec["batch"]])
        states.append(rec["resume_state"])

    system = await build_system(cfg, make_env, TASKS, [engine], LocalRuntime(), resume_state=resume_state)
    buf = system.buffer.obj
    write = buf.write

    async def first_member_wins(traj):  # a reward spread in every group, so every step trains
        traj.outcome_reward = traj.reward = float(traj.id.endswith("/0"))
        return await write(traj)

    buf.write = first_member_wins
    try:
        await train(system, learner, steps=steps, batch_groups=cfg.trainer.batch_groups, on_step=on_step)
    finally:
        await shutdown(system)
    return seen, states


async def test_resumed_run_equals_the_run_never_stopped(tmp_path):
    path = resolve_model("smollm2-135m")
    cfg = small_config("sync", **{"laminar.num_relays": 1, "trainer.batch_groups": 2, "sampling.max_tokens": 3,
                                  "trainer.lr": 1e-4, "trainer.micro_batch_size": 4})

    def learner() -> Learner:
        torch.manual_seed(0)
        return Learner(path, cfg.trainer, temperature=cfg.sampling.temperature, reward_cfg=cfg.reward)

    straight = learner()
    seen_straight, _ = await _run(cfg, straight, path, steps=2)

    first = learner()
    seen_a, states = await _run(cfg, first, path, steps=1)
    ckpt = save_checkpoint(tmp_path, first, extra={"laminar": states[-1]})
    del first
    torch.manual_seed(123)  # the checkpoint's RNG states must win over whatever ran since
    resumed = Learner(path, cfg.trainer, temperature=cfg.sampling.temperature, reward_cfg=cfg.reward)
    extra = load_checkpoint(ckpt, resumed)
    assert resumed.version == 1
    seen_b, _ = await _run(cfg, resumed, path, steps=1, resume_state=extra["laminar"])

    assert seen_a + seen_b == seen_straight  # same groups, same order (3 tasks: crosses an epoch)
    assert resumed.version == straight.version == 2
    assert not torch.equal(straight.model.lm_head.weight, Learner(path, cfg.trainer).model.lm_head.weight)
    for (name, a), (_, b) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
