"""The Laminar pipeline with real components: the embedded model in two HFEngines, the real
RolloutEngine and the real Learner, on the local runtime (and on a local Ray cluster)."""

import asyncio

import pytest

from agentrl.inference.hf import HFEngine
from agentrl.laminar.loop import build_system, shutdown, train
from agentrl.laminar.runtime import LocalRuntime
from agentrl.models import resolve_model
from agentrl.trainer.learner import Learner
from agentrl.types import Status

from .helpers import check_single_version, make_spread_env, small_config, tail_tasks


def _form(t):
    return (t.status, len(t.segments), t.num_turns, sorted(t.timings), [s.check() for s in t.segments])


@pytest.mark.slow
async def test_real_model_two_workers_long_tails():
    path = resolve_model("smollm2-135m")
    cfg = small_config("laminar", **{"sampling.max_tokens": 3, "laminar.chunk_bytes": 64 * 1024 * 1024,
                                     "trainer.lr": 1e-6})
    engines = [HFEngine(path, max_batch_size=4, seed=i) for i in range(2)]
    learner = Learner(path, cfg.trainer, temperature=cfg.sampling.temperature, reward_cfg=cfg.reward)
    # every turn waits 0.5 s on its tool, so the 2 cores are mostly free for the learner
    # padded shorts: the tails stay below the batch's plateau, so the repack move is certain
    tasks = tail_tasks(2, long_turns=5, tool_s=0.5, short_pad_words=200)
    for t in tasks:
        t["tool_s"] = 0.5
    system = await build_system(cfg, make_spread_env, tasks, engines, LocalRuntime(), shuffle_prompts=False)
    seen = []
    orig_step = learner.step

    def step(groups):
        seen.append(groups)
        return orig_step(groups)

    learner.step = step
    written = []  # every trajectory that reached the buffer, consumed or not
    buf = system.buffer.obj
    orig_write = buf.write

    async def write(traj):
        written.append(traj)
        return await orig_write(traj)

    buf.write = write
    try:
        summary = await asyncio.wait_for(train(system, learner, steps=3, batch_groups=1), 240)
        relay1 = await system.chain.relays[1].get_stats()
    finally:
        await shutdown(system)
    # versions advance and every trajectory is single-version
    assert summary["final_version"] == 3
    groups = [g for batch in seen for g in batch]
    check_single_version(groups)
    pulled = {v for w in summary["workers"].values() for v in w["versions"]}
    assert pulled and max(pulled) >= 1, "workers run the updated weights"
    # the trainer's stall is its push copy, not the broadcast: relay1 finished receiving each
    # version after the trainer had already moved on (the stall's rest is a few awaits, whose
    # scheduling beside two generating engines on a loaded 2-core machine took up to 0.4 s)
    for rec in summary["records"]:
        assert rec["push_copy_s"] <= rec["push_stall_s"] < rec["push_copy_s"] + 0.75
        assert relay1["completed_at"][rec["version"]] > rec["pushed_at"]
    assert summary["weight_pull_s"], "workers pulled new weights"
    # repack moved a long tail; the moved trajectories finish like unmoved ones
    assert summary["repack_moves"] >= 1, summary["moves"]
    moved_ids = {t for m in summary["moves"] for t in m["trajectories"]}
    long = [t for t in written if t.task_id.startswith("L")]
    moved = [t for t in long if t.id in moved_ids]
    unmoved = [t for t in long if t.id not in moved_ids]
    assert moved and unmoved, ([t.id for t in written], moved_ids)
    for t in moved:
        assert t.status == Status.FINISHED and t.num_turns == 5
        assert _form(t) == _form(unmoved[0])
