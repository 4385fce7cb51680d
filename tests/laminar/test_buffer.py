"""Experience buffer: group atomicity (§1.8 test 4), staleness (§1.8 test 3), sampling, eviction."""

import asyncio
import pickle

import pytest

from agentrl.laminar.buffer import ExperienceBuffer, GroupVersionError
from agentrl.types import Segment, Status, Trajectory


def traj(gid: str, i: int, version: int, finished: int | None = None) -> Trajectory:
    seg = Segment()
    seg.append([1, 2], policy=False)
    seg.append([3, 4, 5], policy=True, logprobs=[-0.1] * 3, version=version)
    return Trajectory(id=f"{gid}-{i}", group_id=gid, task_id=gid, segments=[seg],
                      status=Status.FINISHED, finished_version=finished)


async def test_group_visible_only_when_complete():
    buf = ExperienceBuffer(group_size=4)
    for i in range(3):
        assert not await buf.write(traj("g", i, 2))
        assert await buf.ready() == 0
    assert await buf.write(traj("g", 3, 2))
    assert await buf.ready() == 1
    (g,) = await buf.sample(1)
    assert len(g.trajectories) == 4 and g.version == 2


async def test_mixed_versions_are_rejected():
    buf = ExperienceBuffer(group_size=4)
    for i in range(3):
        await buf.write(traj("g", i, 2))
    with pytest.raises(GroupVersionError, match="mixes weight versions"):
        await buf.write(traj("g", 3, 1))
    assert await buf.ready() == 0


async def test_staleness_tags():
    buf = ExperienceBuffer(group_size=1)
    await buf.set_version(5)
    await buf.write(traj("g", 0, 3))  # finished while the trainer is at 5
    await buf.set_version(6)
    (g,) = await buf.sample(1)
    t = g.trajectories[0]
    assert (t.finished_version, t.consumed_version, t.staleness) == (5, 6, 2)
    assert (await buf.stats())["staleness_hist"] == {2: 1}


async def test_fifo_lifo_and_waiting():
    buf = ExperienceBuffer(group_size=1, sampling="fifo")
    waiter = asyncio.create_task(buf.sample(2))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    for k in range(3):
        await buf.write(traj(f"g{k}", 0, 0))
    assert [g.id for g in await waiter] == ["g0", "g1"]
    lifo = ExperienceBuffer(group_size=1, sampling="lifo")
    for k in range(3):
        await lifo.write(traj(f"g{k}", 0, 0))
    assert [g.id for g in await lifo.sample(2)] == ["g2", "g1"]
    with pytest.raises(asyncio.TimeoutError):
        await buf.sample(5, timeout_s=0.01)


async def test_capacity_eviction_and_max_staleness():
    buf = ExperienceBuffer(group_size=1, capacity=2)
    for k in range(3):
        await buf.write(traj(f"g{k}", 0, k))
    assert buf.evicted_ids == ["g0"] and await buf.ready() == 2
    st = ExperienceBuffer(group_size=1, max_staleness=1)
    await st.write(traj("old", 0, 0))
    await st.write(traj("new", 0, 2))
    await st.set_version(2)
    assert st.evicted_ids == ["old"]
    assert [g.id for g in await st.sample(1)] == ["new"]


async def test_drop_group_and_state_roundtrip():
    buf = ExperienceBuffer(group_size=2)
    await buf.write(traj("a", 0, 1))
    await buf.write(traj("b", 0, 1))
    await buf.write(traj("b", 1, 1))
    assert await buf.drop_group("a") == 1
    state = await buf.state_dict()
    other = ExperienceBuffer(group_size=2)
    await other.load_state_dict(state)
    assert (await other.stats()) == (await buf.stats())
    assert [g.id for g in await other.sample(1)] == ["b"]


async def test_a_cursor_reads_as_the_state_it_was_taken_at():
    """The loop takes a cursor every step and a checkpoint writes it out later: what the buffer
    hands out meanwhile (consumed tags, the learner's rewards) and what arrives must not leak in."""
    buf = ExperienceBuffer(group_size=2)
    for gid in ("a", "b"):
        await buf.write(traj(gid, 0, 1))
        await buf.write(traj(gid, 1, 1))
    await buf.write(traj("c", 0, 1))  # a partial group
    want = await buf.state_dict()
    cursor = await buf.cursor()
    for g in await buf.sample(2):  # the group of the pending member too, once it completes
        for t in g.trajectories:
            t.reward = 9.0  # as the learner sets it
    await buf.write(traj("c", 1, 1))
    (c,) = await buf.sample(1)
    c.trajectories[0].reward = 7.0
    await buf.drop_group("d")
    assert dict(cursor) == want and cursor["ready"][0]["trajectories"][0]["consumed_version"] is None
    restored = pickle.loads(pickle.dumps({"buffer": cursor}))["buffer"]  # a checkpoint holds the plain dict
    assert type(restored) is dict and restored == want
    other = ExperienceBuffer(group_size=2)
    await other.load_state_dict(cursor)
    assert [g.id for g in await other.sample(2)] == ["a", "b"]


def test_a_trajectory_version_follows_its_tokens():
    """`Trajectory.version` is kept as tokens are appended (not a scan per read), and still sees
    tokens truncated away, lists replaced and an exact to_dict/from_dict round trip."""
    t = traj("g", 0, 3)
    assert t.version == 3
    seg = t.segments[0]
    seg.append([6], policy=True, logprobs=[-0.2], version=4)
    with pytest.raises(ValueError, match=r"mixes weight versions \[3, 4\]"):
        _ = t.version
    seg.truncate(5)
    assert t.version == 3
    seg.versions = [-1, -1, 5, 5, 5]
    assert t.version == 5
    back = Trajectory.from_dict(t.to_dict())
    assert back == t and back.to_dict() == t.to_dict() and back.version == 5
    assert "_versions_seen" not in t.to_dict()["segments"][0]
    seg.loss_mask = [0] * 5
    assert t.version is None


async def test_bad_input():
    with pytest.raises(ValueError, match="group_size"):
        ExperienceBuffer(group_size=0)
    with pytest.raises(ValueError, match="sampling strategy"):
        ExperienceBuffer(group_size=1, sampling="random-ish")
    buf = ExperienceBuffer(group_size=1)
    await buf.write(traj("a", 0, 1))
    with pytest.raises(ValueError, match="already complete"):
        await buf.write(traj("a", 0, 1))


async def test_duplicate_member():
    buf = ExperienceBuffer(group_size=2)
    await buf.write(traj("a", 0, 1))
    with pytest.raises(ValueError, match="written twice"):
        await buf.write(traj("a", 0, 1))
